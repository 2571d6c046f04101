"""Base models from GGUF files: de-quantized once into a plain Hugging Face directory.

    from trainer.gguf import is_gguf, resolve_gguf
    model_dir = resolve_gguf("models/SmolLM2-135M-Instruct.Q4_1.gguf")   # or gs://.../x.gguf

A `.gguf` base model (a local path or any fsspec URI) is read with transformers' own GGUF loader
(`from_pretrained(folder, gguf_file=name)`, which needs the `gguf` package), which de-quantizes
every tensor. That model still carries a GGUF quantizer, and `save_pretrained` refuses it, so the
model is rebuilt from its config without the quantizer and handed the de-quantized state dict; it is
saved, with the tokenizer, chat template and generation config read from the same file, to
`$LLMFT_CACHE_DIR/gguf/<sha256 of the file>/`. Every later use (each rank, each step, each run on
this machine) loads that directory like any other base model.

Why a converted directory rather than loading the GGUF everywhere: the trainer builds the model on
the meta device and loads a state dict on rank 0 only, the evaluator and exporter read
config/tokenizer files, and Beam workers read tokenizer.json; all of that works unchanged on a
save_pretrained directory. The cache key is the file's content, so a renamed copy is not converted
twice and a changed file is never served stale. One lock per machine makes concurrent processes
(torchrun ranks, pipeline steps) convert once: the others wait and then find it done.

What is kept and lost (docs/trainer.md): the weights are exactly the quantized values, stored in
fp32 (lossless for them; the precision lost when the GGUF was quantized does not come back); the
architecture config, tokenizer, special tokens and chat template come from the file's metadata.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

from trainer import storage
from trainer.storage import cache_dir

log = logging.getLogger(__name__)

SUFFIX = ".gguf"
COMPLETE = ".complete"


def is_gguf(spec: str) -> bool:
    """Whether a base model spec names a GGUF file (by its suffix; local path or URI)."""
    return spec.lower().endswith(SUFFIX)


MAGIC = b"GGUF"
"""The first bytes of every GGUF file (a name ending in .gguf proves nothing)."""


def not_gguf(path: str | Path, name: str | None = None) -> str | None:
    """Why the local file `path` (the user's `name` for it, if another), named like a GGUF file,
    is not one (None when it is one): found before a conversion or a training run loads it."""
    name = name or str(path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(MAGIC))
    except OSError as exc:
        return f"base model {name!r} cannot be read ({exc.strerror or exc})"
    if head != MAGIC:
        return (
            f"base model {name!r} is named .gguf but is not a GGUF file (it does not start "
            "with the GGUF magic bytes): pass a real .gguf file or a Hugging Face model directory"
        )
    return None


def gguf_errors(spec: str, label: str) -> list[str]:
    """Why the local base model `spec`, named like a GGUF file, cannot be used (empty: it can):
    it does not exist, or it is not a GGUF file. `label` names it as the caller's user typed it."""
    path = Path(spec).expanduser()
    if not path.is_file():
        return [f"{label} does not exist: pass an existing .gguf file"]
    problem = not_gguf(path, spec)
    return [problem] if problem else []


def gguf_cache_dir() -> Path:
    return cache_dir() / "gguf"


@contextlib.contextmanager
def _machine_lock(cache: Path) -> Iterator[None]:
    """An exclusive lock held by one process of this machine at a time (released on exit/crash)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _local_file(spec: str, cache: Path) -> Path:
    """A local path holding the GGUF file `spec` (a remote one is copied into the cache once)."""
    if not storage.is_remote(spec):
        path = Path(storage.local_path(spec)).expanduser()
        if not path.is_file():
            raise ValueError(f"base model {spec!r} does not exist: pass an existing .gguf file")
        return path
    if not storage.exists(spec) or storage.isdir(spec):
        raise ValueError(f"base model {spec!r} does not exist: pass an existing .gguf file")
    key = hashlib.sha256(spec.encode()).hexdigest()[:16]
    local = cache / "downloads" / key / spec.rstrip("/").rsplit("/", 1)[-1]
    if not local.exists():
        partial = local.with_suffix(".partial")
        log.info("downloading %s to %s", spec, local)
        storage.copy_to_local(spec, partial)
        partial.rename(local)
    return local


def file_digest(path: Path) -> str:
    """sha256 of the file's bytes (the cache key)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_gguf(spec: str) -> str:
    """The converted Hugging Face directory for the GGUF file `spec`; converts on first use.

    Raises ValueError when the file does not exist or transformers cannot read its architecture.
    """
    cache = gguf_cache_dir()
    with _machine_lock(cache):
        local = _local_file(spec, cache)
        if problem := not_gguf(local, spec):
            raise ValueError(problem)
        target = cache / file_digest(local)[:32]
        if not (target / COMPLETE).exists():
            partial = target.with_suffix(".partial")
            shutil.rmtree(partial, ignore_errors=True)  # a conversion that died half-way
            shutil.rmtree(target, ignore_errors=True)
            log.info("converting %s to a Hugging Face directory at %s", spec, target)
            convert(local, partial)
            partial.rename(target)
            (target / COMPLETE).touch()
    return str(target)


def convert(gguf_file: Path, out: Path) -> None:
    """De-quantize `gguf_file` into `out` with save_pretrained: fp32 weights, config, tokenizer."""
    # torch (3.8 s to import, min of 3, shared 2-core machine) only to convert: the preprocess step
    # imports this module for is_gguf/resolve_gguf without torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.meta_init import parameters_on_meta

    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        quantized = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, OSError, KeyError) as exc:
        raise ValueError(
            f"transformers cannot load {gguf_file} ({type(exc).__name__}: {exc}): use a GGUF of an "
            "architecture transformers supports (llama, mistral, qwen2, ...) or a model directory"
        ) from None
    config = quantized.config
    del config.quantization_config  # what makes save_pretrained refuse the model
    config.name_or_path = name
    state = quantized.state_dict()
    del quantized
    # Parameters on meta and assigned from the state dict: one copy of the weights in memory.
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=True, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
