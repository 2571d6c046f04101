"""Evaluate a fine-tuned model against its base (and the registered champion) on the eval split.

Run: `llmft evaluate --base PATH --tuned PATH --data DIR --output DIR [--heldout FILE] ...`, or call
`run_evaluation(EvaluationRequest(...))` (the KFP `evaluate` step does). Writes to the output directory (local or
gs://):

    metrics.json        scalars, the gate decision with each check, model paths, settings, the
                        lm-evaluation-harness tasks per model and the judge's verdict
    generations.jsonl   every held-out prompt with the reference and each model's answer
                        (and, when the forgetting check is on, every general probe's answers)
    report.html         self-contained report: before/after table, training curve, samples

Models are evaluated one at a time (only one is resident in memory, sharded over every GPU when
there are several: loading.py) on exactly the same rows, prompts and harness tasks, with
deterministic greedy decoding, so differences come from the weights alone. All inputs are checked
before any model is loaded: paths, the eval split, every model's tokenizer against the tokenizer
the dataset was packed with, the harness task names, and whether each model fits the evaluation
machine's GPU memory (memory_fit.py). The optional pairwise judge (judge.py) compares the base
and tuned answers to the held-out prompts after both models ran.

A model trained with objective=dpo is evaluated on the preference dataset's held-out pairs: each
model's response log-probabilities, then against the base as reference (trainer/preference.py)
the DPO loss as its eval loss, the win rate (share of pairs whose implicit reward prefers the
chosen response) and the mean reward margin (outputs.Scores.add_preference). After QLoRA
(`quantize_base="nf4"`) the reference is the base as the trainer multiplied by: its decoder
blocks' linears through the same NF4 round trip in the trainer's compute dtype
(trainer/quantize.py `round_trip_blocks`); the base's own metrics stay those of the base as given.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from components.evaluation import data as data_io
from components.evaluation.gate import GateThresholds, decide
from components.evaluation.general_probes import MAX_NEW_TOKENS as PROBE_MAX_NEW_TOKENS
from components.evaluation.general_probes import load_probes
from components.evaluation.generation import generate_answers, has_chat_template
from components.evaluation.harness import HarnessSettings, check_tasks, run_tasks, settings_errors
from components.evaluation.judge import JudgeSettings, judge_pairwise
from components.evaluation.loading import (
    check_model_path,
    gguf_as_directory,
    is_hub_id,
    loaded_model,
    read_tokenizer,
)
from components.evaluation.memory_fit import (
    Machine,
    accelerator_memory_gib,
    fit_error,
    parameter_count,
)
from components.evaluation.outputs import (
    EvaluationResult,
    Scores,
    check_output_dir,
    write_outputs,
)
from components.evaluation.scoring import score_rows
from trainer import storage
from trainer.config import DTYPES, QUANTIZE_BASES, TrainConfig
from trainer.packed_data.format import (
    PREFERENCE_KIND,
    Manifest,
    TokenizerIdentity,
    compatibility_errors,
)

log = logging.getLogger(__name__)


def _exists(path: str) -> bool:
    return storage.exists(path)


def _validate_args(request: EvaluationRequest) -> None:
    """Collect every argument error and raise them together."""
    errors: list[str] = []
    for what, path in (
        ("base model", request.base),
        ("tuned model", request.tuned),
        ("champion model", request.champion),
    ):
        if path is None:
            continue
        try:
            check_model_path(path, what)
        except ValueError as exc:
            errors.append(str(exc))
    if not request.data_dir:
        errors.append("data directory is empty: pass the output directory of `llmft preprocess`")
    for what, path in (
        ("held-out file", request.heldout),
        ("training metrics file", request.train_metrics),
    ):
        if path and not _exists(path):
            errors.append(f"{what} {path!r} does not exist")
    if request.max_examples < 0:
        errors.append(f"max_examples must be >= 0 (0 skips generation), got {request.max_examples}")
    if request.max_eval_rows is not None and request.max_eval_rows < 1:
        errors.append(f"max_eval_rows must be >= 1 or unset, got {request.max_eval_rows}")
    for name, value in (
        ("batch_size", request.batch_size),
        ("generation_batch_size", request.generation_batch_size),
        ("max_new_tokens", request.max_new_tokens),
    ):
        if value < 1:
            errors.append(f"{name} must be >= 1, got {value}")
    if request.num_samples < 0:
        errors.append(f"num_samples must be >= 0, got {request.num_samples}")
    try:
        request.thresholds.validate()
    except ValueError as exc:
        errors.append(str(exc))
    errors += settings_errors(request.harness) + request.judge.errors()
    if request.accelerator_count < 0:
        errors.append(f"accelerator_count must be >= 0, got {request.accelerator_count}")
    if request.objective not in OBJECTIVES:
        errors.append(
            f"objective must be one of {', '.join(OBJECTIVES)}, got {request.objective!r}"
        )
    if not request.dpo_beta > 0:
        errors.append(f"dpo_beta must be > 0, got {request.dpo_beta}")
    if request.quantize_base not in QUANTIZE_BASES:
        errors.append(
            f"quantize_base must be one of {', '.join(QUANTIZE_BASES)}, "
            f"got {request.quantize_base!r}"
        )
    if request.compute_dtype not in DTYPES:
        errors.append(
            f"compute_dtype must be one of {', '.join(DTYPES)}, got {request.compute_dtype!r}"
        )
    if errors:
        raise ValueError("; ".join(errors))


OBJECTIVES = ("sft", "dpo")
"""What the tuned model was trained for (TrainConfig.objective's values)."""


def _check_objective(objective: str, manifest: Manifest, data_dir: str) -> None:
    """DPO is evaluated on preference pairs, and preference pairs only under DPO."""
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


def _example_paths(data_dir: str, heldout: str | None, manifest: Manifest) -> list[str]:
    if heldout:
        return [heldout]
    if manifest.data_kind != "instruction":
        log.info("data kind %r has no reference answers: skipping generation", manifest.data_kind)
        return []
    paths = data_io.eval_record_files(data_dir, manifest)
    if not paths and manifest.data_kind == "instruction":
        log.warning(
            "no %s/part-*.jsonl in %s and no held-out file given: skipping generation metrics",
            data_io.EVAL_RECORDS_DIR,
            data_dir,
        )
    return paths


@dataclass(frozen=True)
class EvaluationRequest:
    """What `run_evaluation` compares, where the outputs go, and how."""

    base: str
    """The model before fine-tuning (local dir or gs:// written by save_pretrained)."""
    tuned: str
    """The fine-tuned model exported by the trainer."""
    data_dir: str
    """Packed dataset directory (`llmft preprocess` output); its eval split is scored."""
    output_dir: str
    """Where the outputs go (local or gs://)."""
    max_examples: int = 64
    """Held-out prompts to generate answers for (0 skips generation)."""
    heldout: str | None = None
    """JSONL of prompt/response records for generation; default: the dataset's
    eval_records/part-*.jsonl."""
    train_metrics: str | None = None
    """The trainer's metrics JSONL, plotted as the training loss curve."""
    train_cost: str | None = None
    """The training job's actual cost (the train step's cost.json), kept in metrics.json and
    shown in the report."""
    champion: str | None = None
    """The currently registered model (see components.serving.registry), evaluated the same way and
    compared against when `thresholds.compare_to_champion`."""
    thresholds: GateThresholds = field(default_factory=GateThresholds)
    """The quality gate's thresholds."""
    max_eval_rows: int | None = None
    """Packed eval rows to score (default all)."""
    batch_size: int = 4
    """Packed rows per forward pass."""
    generation_batch_size: int = 16
    """Prompts per generate call."""
    max_new_tokens: int = 64
    """Generation length limit (EOS usually stops earlier)."""
    num_samples: int = 8
    """Side-by-side samples shown in the report."""
    device: str | None = None
    """Torch device; default CUDA (bf16) when present (sharded over all GPUs when several), else
    CPU (fp32)."""
    overwrite: bool = False
    """Replace metrics.json, generations.jsonl and report.html in `output_dir` even when no
    evaluation wrote them (`outputs.check_output_dir`)."""
    device_map: str | dict[str, Any] | None = None
    """An accelerate device map to shard every model with (wins over `device`)."""
    accelerator_type: str = ""
    """The evaluation machine's accelerator (Vertex name, e.g. NVIDIA_L4) for the memory check;
    "" measures the GPUs this process sees (none: no check)."""
    accelerator_count: int = 0
    """How many of `accelerator_type` the machine has."""
    harness: HarnessSettings = field(default_factory=HarnessSettings)
    """lm-evaluation-harness tasks run on every model (none by default)."""
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    """The optional pairwise judge (off by default)."""
    objective: str = TrainConfig.objective
    """What the tuned model was trained for: "sft", or "dpo" (the data must be preference pairs;
    the win rate and reward margin on them are added, and the eval loss is DPO's)."""
    dpo_beta: float = TrainConfig.dpo_beta
    """DPO's beta, as trained with: scales the implicit rewards (the margin and the loss, not
    the win rate)."""
    quantize_base: str = TrainConfig.quantize_base
    """The trainer's `quantize_base`: with "nf4" (QLoRA) DPO's reference is the base with its
    decoder blocks' linear weights through NF4 and back, as the trainer's reference was."""
    compute_dtype: str = TrainConfig.dtype
    """The trainer's compute dtype (summary.json's `compute_dtype`), which an NF4 reference is
    de-quantized to; "auto" resolves as the trainer does on this evaluation's device."""


def run_evaluation(request: EvaluationRequest) -> EvaluationResult:
    """Score base, tuned (and champion) models; write metrics.json, generations.jsonl, report.html.

    Every argument is checked first (all problems in one ValueError), then every model's
    tokenizer against the dataset's, before any model is loaded.
    """
    _validate_args(request)
    if request.device is not None:
        _check_device(request.device)
    if "://" not in request.output_dir and os.path.isfile(request.output_dir):
        raise ValueError(
            f"output {request.output_dir!r} is a file: give a directory for the report"
        )
    check_output_dir(request.output_dir, overwrite=request.overwrite)
    manifest = data_io.load_manifest(request.data_dir)
    _check_objective(request.objective, manifest, request.data_dir)
    roles = {
        "base": request.base,
        "tuned": request.tuned,
        **({"champion": request.champion} if request.champion else {}),
    }
    tokenizers = _checked_tokenizers(roles, manifest)
    _check_fit(roles, request)
    task_index = check_tasks(request.harness.tasks) if request.harness.tasks else None
    rows = data_io.read_eval_rows(request.data_dir, manifest, request.max_eval_rows)
    examples = _examples(
        request.data_dir, request.heldout, manifest, request.max_examples, tokenizers["tuned"]
    )
    probes = load_probes() if request.thresholds.min_general_retained > 0 else []
    if probes and not all(has_chat_template(tok) for tok in tokenizers.values()):
        log.warning("a model's tokenizer has no chat template: skipping the general probes")
        probes = []
    log.info(
        "evaluating %s on %d eval rows (seq_len %d) and %d held-out prompts; thresholds %s",
        ", ".join(f"{role}={path}" for role, path in roles.items()),
        len(rows),
        manifest.seq_len,
        len(examples),
        asdict(request.thresholds),
    )
    if request.judge.enabled and not examples:
        log.warning("the judge needs held-out prompts and none are evaluated: judge skipped")
    inputs = _Inputs(
        manifest=manifest, rows=rows, examples=examples, probes=probes, task_index=task_index
    )
    scores = _score_models(request, roles, tokenizers, inputs)
    if request.objective == "dpo":
        scores.add_preference(request.dpo_beta)
    if request.judge.enabled and examples:
        scores.add_judge(
            judge_pairwise(
                [ex.prompt_text for ex in examples],
                scores.answers["base"],
                scores.answers["tuned"],
                request.judge,
            )
        )
    metrics = scores.summary(probes, rows=len(rows), examples=len(examples))
    decision = decide(metrics, request.thresholds)
    log.info(
        "gate %s: %s",
        "passed" if decision.passed else "FAILED",
        decision.failures or "all checks ok",
    )
    settings = {
        "data_dir": request.data_dir,
        "heldout": request.heldout,
        "max_examples": request.max_examples,
        "max_eval_rows": request.max_eval_rows,
        "max_new_tokens": request.max_new_tokens,
        "device": scores.device,
        "thresholds": asdict(request.thresholds),
        "harness": request.harness.describe(),
        "judge_metric": request.judge.metric,
        "objective": request.objective,
        "dpo_beta": request.dpo_beta,
        "quantize_base": request.quantize_base,
        "compute_dtype": request.compute_dtype,
    }
    return write_outputs(
        request.output_dir,
        scores=scores,
        decision=decision,
        roles=roles,
        examples=examples,
        probes=probes,
        num_samples=request.num_samples,
        settings=settings,
        train_metrics=request.train_metrics,
        train_cost=request.train_cost,
    )


@dataclass(frozen=True)
class _Inputs:
    """What every model is scored on: the same rows, prompts and probes."""

    manifest: Manifest
    rows: Any
    examples: list[Any]
    probes: list[Any]
    task_index: Any = None
    """The harness's task index (checked task names), None when no task runs."""


def _score_models(
    request: EvaluationRequest, roles: dict[str, str], tokenizers: dict[str, Any], inputs: _Inputs
) -> Scores:
    """Every model in turn (only one resident in memory), on the same inputs."""
    scores = Scores()
    for role, path in roles.items():
        with loaded_model(
            path,
            what=f"{role} model",
            device=request.device,
            tokenizer=tokenizers[role],
            device_map=request.device_map,
        ) as lm:
            _check_vocab(role, path, lm.model, inputs.manifest)
            scores.device = lm.describe()
            _score(lm, role, inputs, scores, request)
            if role == "base" and _quantized_reference(request):
                _score_quantized_reference(lm, inputs, scores, request)
    return scores


def _quantized_reference(request: EvaluationRequest) -> bool:
    """Whether DPO's reference is the NF4 round trip of the base (QLoRA), not the base itself."""
    return request.objective == "dpo" and request.quantize_base == "nf4"


def _score_quantized_reference(
    lm: Any, inputs: _Inputs, scores: Scores, request: EvaluationRequest
) -> None:
    """After the base's own scores: its decoder blocks' linears through the trainer's NF4 round
    trip (in place; the model is dropped after this), then the pairs' log-probabilities again,
    which replace the base's as DPO's reference (outputs.Scores.add_preference)."""
    from trainer.model import decoder_blocks, dtype_of
    from trainer.quantize import round_trip_blocks

    model = lm.model
    model.requires_grad_(False)  # every weight of the reference is frozen, as in the trainer
    dtype = dtype_of(request.compute_dtype, lm.device)
    names = round_trip_blocks(model, decoder_blocks(model, model.config.num_hidden_layers), dtype)
    log.info(
        "DPO reference: the base with %d linear weights through NF4 and back in %s "
        "(quantize_base=nf4, as the trainer's)",
        len(names),
        dtype,
    )
    loss = score_rows(model, inputs.rows, device=lm.device, batch_size=request.batch_size)
    assert loss.pair_logps is not None, "objective=dpo is scored on preference pairs"
    scores.add_pair_logps("base", loss.pair_logps)


def _score(lm: Any, role: str, inputs: _Inputs, scores: Scores, request: EvaluationRequest) -> None:
    """One loaded model: loss on the packed rows, answers to the prompts and the probes."""
    loss = score_rows(lm.model, inputs.rows, device=lm.device, batch_size=request.batch_size)
    scores.add_loss(role, loss)
    if loss.pair_logps is not None:
        scores.add_pair_logps(role, loss.pair_logps)
    if inputs.examples:
        answers = generate_answers(
            lm.model,
            lm.tokenizer,
            inputs.examples,
            device=lm.device,
            batch_size=request.generation_batch_size,
            max_new_tokens=request.max_new_tokens,
        )
        scores.add_answers(role, answers, inputs.examples)
    scores.add_target_tokens(loss)
    if inputs.probes:
        answers = generate_answers(
            lm.model,
            lm.tokenizer,
            [p.example() for p in inputs.probes],
            device=lm.device,
            batch_size=request.generation_batch_size,
            max_new_tokens=PROBE_MAX_NEW_TOKENS,
        )
        scores.add_probe_answers(role, answers, inputs.probes)
    if request.harness.tasks:
        scores.add_tasks(
            role, run_tasks(lm.model, lm.tokenizer, request.harness, inputs.task_index)
        )


def _checked_tokenizers(roles: dict[str, str], manifest: Manifest) -> dict[str, Any]:
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


def _examples(
    data_dir: str, heldout: str | None, manifest: Manifest, max_examples: int, tokenizer: Any
) -> list[Any]:
    """The held-out prompts to generate answers for ([] when generation is off or impossible)."""
    if max_examples <= 0:
        return []
    examples = data_io.read_examples(_example_paths(data_dir, heldout, manifest), max_examples)
    if examples and not has_chat_template(tokenizer):
        log.warning("the tuned model's tokenizer has no chat template: skipping generation")
        return []
    return examples


def _check_vocab(role: str, path: str, model: Any, manifest: Manifest) -> None:
    vocab = model.get_input_embeddings().num_embeddings
    if vocab < manifest.tokenizer.vocab_size:
        raise ValueError(
            f"{role} model {path!r} has {vocab} token embeddings but the dataset's "
            f"tokenizer has {manifest.tokenizer.vocab_size} tokens: resize the model's "
            "embeddings to the tokenizer or preprocess with the model's own tokenizer"
        )


def _check_device(device: str) -> None:
    """A torch device this machine has, before any model loads."""
    import torch

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
    import torch

    if request.device_map is not None or not torch.cuda.is_available():
        return None
    if request.device is not None and torch.device(request.device).type != "cuda":
        return None
    count = 1 if request.device is not None else torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    return Machine(props.name, count, props.total_memory / 2**30)


def _check_fit(roles: dict[str, str], request: EvaluationRequest) -> None:
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
