"""A model's size as the cost estimate and the memory-fit check need it (`ModelSize`), read from
its config.json alone: a local directory, any fsspec URI (gs://), or a Hugging Face Hub id (that
one file, one bounded request, kept per process). No weights are read: the parameters are
counted on the meta device.

Also the sizes that follow from it: training FLOPs per token (the trainer's own formula), one DCP
checkpoint's size and the weights' bytes on disk (`weight_bytes`: a GKE pod's ephemeral storage).
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.platform.node_facts import model_bytes
from components.runtime.model_location import is_hub_id
from trainer import storage
from trainer.gpu_peaks import flops_per_token as trainer_flops_per_token

log = logging.getLogger(__name__)

CHECKPOINT_BYTES_PER_PARAM = 4
"""fp32 master weights; + 8 bytes (AdamW's two moments) per trainable parameter."""
CHECKPOINT_BYTES_PER_TRAINABLE = 8


@dataclass(frozen=True)
class ModelSize:
    """What the throughput model needs to know about the model."""

    parameters: int
    """All parameters."""
    matmul_parameters: int
    """Parameters in matrix products (all but the input embedding)."""
    layers: int = 0
    """Decoder layers (0: unknown, the attention term is left out)."""
    hidden: int = 0
    """Hidden size."""

    @classmethod
    def of_count(cls, parameters: int) -> ModelSize:
        """Only the parameter count known (`model_parameters`): every parameter in matmuls."""
        return cls(parameters=parameters, matmul_parameters=parameters)


def model_size(model_dir: str) -> ModelSize:
    """The size of the Hugging Face model at `model_dir` (local or any fsspec URI) from its
    config.json (`size_of(model_config(model_dir))`).

    Raises:
        ValueError: no readable config.json there (a hub id offline, no credentials).
    """
    return size_of(model_config(model_dir))


def model_config(model_dir: str) -> Any:
    """The transformers config of the model at `model_dir`, read from its config.json alone: a
    local directory, any fsspec URI, or a Hugging Face Hub id (`hub_config_text`).

    Raises:
        ValueError: no readable config.json there, saying why (offline, a gated model without
            a token or without access, no such file or repository, the Hub unreachable).
    """
    from transformers import AutoConfig  # ~2 s to import: only where a config is read

    try:
        if is_hub_id(model_dir):
            text = hub_config_text(model_dir)
        else:
            text = storage.read_text(f"{model_dir.rstrip('/')}/config.json")
        config_dict = json.loads(text)
    except Exception as exc:  # OSError, bad JSON, and the hub client's own HTTP and offline errors
        raise ValueError(f"cannot read the config.json of {model_dir} ({_why(exc)})") from None
    return AutoConfig.for_model(**config_dict)


HUB_TIMEOUT_S = 10
"""One attempt at the Hub, this long at most, before a Hub model's config.json is downloaded:
huggingface_hub retries an unanswered request 6 times at 60 s each (~6.5 min per file), which
would hold `llmft run` or the validate step on a network without a route to the Hub."""


def hub_config_text(repo_id: str) -> str:
    """A Hub model's config.json: from huggingface_hub's cache when it is there, else one bounded
    request (`HUB_TIMEOUT_S`) and then the download. The answer, or the error, is kept for the
    process: the fit check and the estimate both ask. The token is the one huggingface_hub finds
    (HF_TOKEN or a saved login); `HF_ENDPOINT` and `HF_HUB_OFFLINE` apply."""
    found = _hub_config(repo_id)
    if isinstance(found, Exception):
        raise found
    return found


@functools.cache
def _hub_config(repo_id: str) -> str | Exception:
    # the Hub client (~0.2 s to import) only when a Hub model is sized
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        try:
            return Path(hf_hub_download(repo_id, "config.json", local_files_only=True)).read_text()
        except LocalEntryNotFoundError:
            pass
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=HUB_TIMEOUT_S)
        return Path(hf_hub_download(repo_id, "config.json")).read_text()
    except Exception as exc:  # the hub client's HTTP, offline and connection errors
        return exc


def _why(exc: Exception) -> str:
    """What to tell a user whose model's config.json could not be read."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import GatedRepoError

    if isinstance(exc, GatedRepoError):
        if get_token():
            return "a gated model this token has no access to: accept its licence on the Hub"
        return "a gated model and no token here: set HF_TOKEN (a pipeline: hf_token_secret)"
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def size_of(config: Any) -> ModelSize:
    """A model's size from its transformers config, counted exactly on the meta device (no
    weights are read or allocated)."""
    import torch  # heavy: torch and transformers only where a model is sized
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    text = config.get_text_config()
    return ModelSize(
        parameters=total,
        matmul_parameters=total - embedding,
        layers=int(getattr(text, "num_hidden_layers", 0) or 0),
        hidden=int(getattr(text, "hidden_size", 0) or 0),
    )


def flops_per_token(size: ModelSize, seq_len: int, *, lora: bool) -> float:
    """Training FLOPs per token: the trainer's own formula (trainer/gpu_peaks.py), the convention
    the MFU in `MFU_MEASURED` was measured in."""
    return trainer_flops_per_token(
        size.matmul_parameters, size.layers, size.hidden, seq_len, lora=lora
    )


def checkpoint_gb(size: ModelSize, *, lora: bool) -> float:
    """Size of one DCP checkpoint in GB (fp32 weights + AdamW moments of what trains)."""
    trainable = 0 if lora else size.parameters  # LoRA adapters are small next to the base
    return (
        size.parameters * CHECKPOINT_BYTES_PER_PARAM + trainable * CHECKPOINT_BYTES_PER_TRAINABLE
    ) / 1e9


def weight_bytes(base_model: str) -> int | None:
    """Bytes of the base model's weights on disk, from its config.json (parameters x the bytes of
    its stored dtype, bf16 unless it says float32); None when the config cannot be read."""
    try:
        config = model_config(base_model)
    except (ValueError, OSError) as exc:
        log.warning("base model size unknown (%s): no ephemeral-storage request", exc)
        return None
    wide = str(getattr(config, "torch_dtype", "") or "").endswith("float32")
    return model_bytes(size_of(config).parameters, 4 if wide else 2)


# --- prices -------------------------------------------------------------------------------------
