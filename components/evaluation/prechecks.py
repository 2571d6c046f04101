"""The checks of an evaluation's inputs before any model's weights load, so that a mismatch costs
seconds, not a model load: the objective against the data's kind, every model's tokenizer against
the one the dataset was packed with, the device, and whether each model fits the evaluation
machine's GPU memory (memory_fit.py). Also the embedding check once a model is loaded. Each
raises ValueError with the fix."""

from __future__ import annotations

import logging
from typing import Any

from components.evaluation.loading import gguf_as_directory, is_hub_id, read_tokenizer
from components.evaluation.memory_fit import (
    Machine,
    accelerator_memory_gib,
    fit_error,
    parameter_count,
)
from components.evaluation.request import EvaluationRequest
from trainer.packed_data.format import (
    PREFERENCE_KIND,
    PROMPTS_KIND,
    Manifest,
    TokenizerIdentity,
    compatibility_errors,
)

log = logging.getLogger(__name__)


def check_objective(objective: str, manifest: Manifest, data_dir: str) -> None:
    """DPO is evaluated on preference pairs, GRPO on prompt records, and each of those kinds
    only under its objective."""
    prompts = manifest.data_kind == PROMPTS_KIND
    if prompts != (objective == "grpo"):
        raise ValueError(
            f"objective={objective} but {data_dir!r} holds {manifest.data_kind} data: "
            + (
                "evaluate a GRPO model with objective=grpo (and its rewards)"
                if prompts
                else "objective=grpo is evaluated on a prompts dataset (--data-kind prompts)"
            )
        )
    if prompts:
        return
    preference = manifest.data_kind == PREFERENCE_KIND
    if preference != (objective == "dpo"):
        raise ValueError(
            f"objective={objective} but {data_dir!r} holds {manifest.data_kind} data: "
            + (
                "evaluate a DPO model with objective=dpo"
                if preference
                else "objective=dpo is evaluated on a preference dataset (--data-kind preference)"
            )
        )


def _check_tokenizer(what: str, path: str, tokenizer: Any, manifest: Manifest) -> None:
    errors = compatibility_errors(manifest, TokenizerIdentity.of(tokenizer), seq_len=None)
    if errors:
        raise ValueError(
            f"{what} {path!r} cannot be evaluated on this dataset: " + "; ".join(errors)
        )


def checked_tokenizers(roles: dict[str, str], manifest: Manifest) -> dict[str, Any]:
    """Every model's tokenizer, checked against the dataset's before any weights load (so a
    mismatch costs seconds); a model without tokenizer files uses the base model's."""
    base = roles["base"]
    base_tokenizer = read_tokenizer(base, "base model")
    if base_tokenizer is None:
        raise ValueError(f"base model {base!r} has no tokenizer files: save the tokenizer with it")
    tokenizers: dict[str, Any] = {}
    for role, path in roles.items():
        tok = base_tokenizer if role == "base" else read_tokenizer(path, f"{role} model")
        if tok is None:
            # Trainer exports sometimes hold only weights; the base tokenizer is what trained them.
            log.warning("%s model %s has no tokenizer files: using the base model's", role, path)
            tok = base_tokenizer
        _check_tokenizer(f"{role} model", path, tok, manifest)
        if manifest.chat_template:  # prompts as the data was rendered (preprocess's option)
            tok.chat_template = manifest.chat_template
        tokenizers[role] = tok
    return tokenizers


def check_vocab(role: str, path: str, model: Any, manifest: Manifest) -> None:
    """A loaded model has an embedding for every token of the dataset's tokenizer."""
    vocab = model.get_input_embeddings().num_embeddings
    if vocab < manifest.tokenizer.vocab_size:
        raise ValueError(
            f"{role} model {path!r} has {vocab} token embeddings but the dataset's "
            f"tokenizer has {manifest.tokenizer.vocab_size} tokens: resize the model's "
            "embeddings to the tokenizer or preprocess with the model's own tokenizer"
        )


def check_device(device: str) -> None:
    """A torch device this machine has, before any model loads."""
    import torch  # only when a device is named: checking one needs torch itself

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device {device!r} is not a torch device: use cpu or cuda[:N]") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this machine has no CUDA device; use cpu")


def _evaluation_machine(request: EvaluationRequest) -> Machine | None:
    """The GPUs the models will be loaded on: as declared (accelerator_type x count), else as
    this process sees them; None on CPU (no memory check: host memory is not ours to plan)."""
    if request.accelerator_type and request.accelerator_count > 0:
        return Machine(
            request.accelerator_type,
            request.accelerator_count,
            accelerator_memory_gib(request.accelerator_type),
        )
    import torch  # the evaluation loads torch anyway; not at the top, so checks import cheaply

    if request.device_map is not None or not torch.cuda.is_available():
        return None
    if request.device is not None and torch.device(request.device).type != "cuda":
        return None
    count = 1 if request.device is not None else torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    return Machine(props.name, count, props.total_memory / 2**30)


def check_fit(roles: dict[str, str], request: EvaluationRequest) -> None:
    """Refuse, before any weights load, a model the evaluation machine cannot hold."""
    machine = _evaluation_machine(request)
    if machine is None:
        return
    errors = []
    for role, path in roles.items():
        if is_hub_id(path):
            continue
        parameters = parameter_count(gguf_as_directory(path))
        if parameters is None:
            log.info("%s model %s: no safetensors headers, memory not checked", role, path)
            continue
        if error := fit_error(f"{role} model {path!r}", parameters, machine=machine):
            errors.append(error)
    if errors:
        raise ValueError("; ".join(errors))
