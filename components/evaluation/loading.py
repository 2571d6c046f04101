"""Load a Hugging Face causal LM and its tokenizer from a local directory or an fsspec URI.

Remote models (gs://, memory://, ...) are copied to local disk first because `from_pretrained`
only reads local paths (`trainer.storage`, streamed file by file); the copy lives exactly
as long as the `loaded_model` context, so nothing is left behind. A `.gguf` file is converted once
into a cached model directory (trainer/gguf.py) and loaded from there. On a CUDA machine the model runs in bf16 (half the memory,
the dtype fine-tunes are trained in); on CPU it runs in float32 because CPU bf16 matmuls are slow
and lossy for little gain.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from trainer import storage
from trainer.gguf import is_gguf

log = logging.getLogger(__name__)

MODEL_CONFIG = "config.json"


@dataclass
class LoadedModel:
    """A model ready for inference, with the tokenizer that came with it."""

    path: str
    model: Any
    tokenizer: Any
    device: Any
    dtype: Any


def pick_device(device: str | None = None) -> tuple[Any, Any]:
    """The torch device and dtype to evaluate with: `device` if given, else CUDA+bf16 or CPU+fp32.

    Raises:
        RuntimeError: the pipeline gave this step GPUs (`LLMFT_EXPECT_CUDA=1`) but CUDA is
            unavailable: scoring a large model in fp32 on CPU would take hours unnoticed.
    """
    import torch

    from trainer.cuda_guard import check_cuda

    check_cuda(torch.cuda.is_available(), "evaluation")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r} requested but CUDA is not available: pass --device cpu"
        )
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, dtype


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(path: str) -> bool:
    """`org/name` that is not a local path: a Hugging Face Hub model id (the pipeline accepts
    them as base models; from_pretrained downloads them, with HF_TOKEN from the environment)."""
    return bool(_HUB_ID.match(path)) and not os.path.exists(path)


def _hub_error(path: str, what: str, exc: Exception) -> ValueError:
    return ValueError(
        f"{what} {path!r} is neither a local directory nor loadable from the Hugging Face Hub "
        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): pass a model "
        "directory (local or gs://) or a Hub id this machine can reach"
    )


def check_model_path(path: str, what: str = "model") -> None:
    """Raise ValueError unless `path` is a directory written by `save_pretrained`."""
    if not path:
        raise ValueError(f"{what} path is empty: pass a model directory (local or gs://)")
    if is_hub_id(path):
        return
    try:
        found = storage.exists(path)
    except PermissionError as exc:
        raise ValueError(f"{what}: {exc}") from None
    if is_gguf(path):
        if not found or storage.isdir(path):
            raise ValueError(f"{what} path {path!r} does not exist: pass an existing .gguf file")
        return
    if not found:
        raise ValueError(
            f"{what} path {path!r} does not exist: pass a directory written by save_pretrained "
            "(for the fine-tuned model, the trainer's output directory)"
        )
    if not storage.exists(storage.join(path, MODEL_CONFIG)):
        raise ValueError(
            f"{what} path {path!r} has no {MODEL_CONFIG}: it is not a Hugging Face model directory "
            "(pass the directory save_pretrained wrote, not a checkpoint or file inside it)"
        )


def gguf_as_directory(path: str) -> str:
    """`path` itself, or for a .gguf file its converted model directory (trainer/gguf.py)."""
    if not is_gguf(path):
        return path
    from trainer.gguf import resolve_gguf

    return resolve_gguf(path)


def _has_tokenizer(local_dir: str) -> bool:
    from pathlib import Path

    return any(
        (Path(local_dir) / name).exists()
        for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )


@contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A local directory holding the model at `path` (the path itself when already local)."""
    if not storage.is_remote(path):
        yield storage.local_path(path)
        return
    with tempfile.TemporaryDirectory(prefix="llmft-eval-model-") as tmp:
        log.info("copying %s to %s", path, tmp)
        yield str(storage.copy_to_local(path, tmp))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")


def read_tokenizer(path: str, what: str = "model") -> Any | None:
    """The tokenizer saved with the model at `path`, or None when it has none.

    Only non-weight files are copied for remote models, so checking a tokenizer against the
    dataset costs kilobytes, not gigabytes, and happens before any model is loaded.
    """
    from transformers import AutoTokenizer

    check_model_path(path, what)
    path = gguf_as_directory(path)
    if is_hub_id(path):
        try:
            return AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise _hub_error(path, what, exc) from None
    if not storage.is_remote(path):
        local = storage.local_path(path)
        return AutoTokenizer.from_pretrained(local) if _has_tokenizer(local) else None
    with tempfile.TemporaryDirectory(prefix="llmft-eval-tokenizer-") as tmp:
        storage.copy_to_local(path, tmp, skip_suffixes=WEIGHT_SUFFIXES)
        return AutoTokenizer.from_pretrained(tmp) if _has_tokenizer(tmp) else None


@contextmanager
def loaded_model(
    path: str,
    *,
    what: str = "model",
    device: str | None = None,
    tokenizer: Any = None,
) -> Iterator[LoadedModel]:
    """Load the model at `path` for inference; free it (and any temporary copy) on exit.

    Args:
        path: local directory or fsspec URI written by `save_pretrained`.
        what: how to name the model in error messages ("base model", "tuned model").
        device: torch device string; default CUDA when present, else CPU.
        tokenizer: the tokenizer to use (from `read_tokenizer`, already checked against the
            dataset); default: the one saved with the model.
    """
    from transformers import AutoModelForCausalLM

    check_model_path(path, what)
    dev, dtype = pick_device(device)
    with local_copy(gguf_as_directory(path)) as local_dir:
        if tokenizer is None:
            if not is_hub_id(local_dir) and not _has_tokenizer(local_dir):
                raise ValueError(
                    f"{what} {path!r} has no tokenizer files (tokenizer.json / "
                    "tokenizer_config.json): save the tokenizer next to the model"
                )
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(local_dir)
        try:
            model = AutoModelForCausalLM.from_pretrained(local_dir, dtype=dtype)
        except OSError as exc:
            if is_hub_id(local_dir):
                raise _hub_error(path, what, exc) from None
            raise
        model.to(dev)
        model.eval()
        log.info("loaded %s from %s on %s (%s)", what, path, dev, dtype)
        loaded = LoadedModel(path=path, model=model, tokenizer=tokenizer, device=dev, dtype=dtype)
        del model
        try:
            yield loaded
        finally:
            # Drop the weights before the next model loads: only one is resident at a time.
            loaded.model = None
            if dev.type == "cuda":
                import torch

                torch.cuda.empty_cache()
