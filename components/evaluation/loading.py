"""Load a Hugging Face causal LM and its tokenizer from a local directory or an fsspec URI.

Remote models (gs://, memory://, ...) are copied to local disk first because `from_pretrained`
only reads local paths (`trainer.storage`, streamed file by file); the copy lives exactly
as long as the `loaded_model` context, so nothing is left behind. A `.gguf` file is converted once
into a cached model directory (trainer/gguf.py) and loaded from there. On a CUDA machine the model runs in bf16 (half the memory,
the dtype fine-tunes are trained in); on CPU it runs in float32 because CPU bf16 matmuls are slow
and lossy for little gain.

Placement (`plan_placement`): with more than one GPU the model is sharded over all of them by
accelerate's `device_map="auto"` (layers split in order, activations handed from GPU to GPU), with
`max_memory` per GPU leaving room for activations, so a model too big for one GPU is still
evaluated and no evaluation GPU sits idle. With one GPU, or on CPU, the whole model goes to one
device as before. An explicit accelerate device map (e.g. half the layers on "cpu", half offloaded
to "disk") is accepted too; the tests shard on CPU that way.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from components.evaluation.memory_fit import USABLE
from components.runtime.model_location import is_hub_id
from trainer import storage
from trainer.cuda_guard import check_cuda
from trainer.gguf import is_gguf, resolve_gguf

log = logging.getLogger(__name__)

MODEL_CONFIG = "config.json"


@dataclass
class LoadedModel:
    """A model ready for inference, with the tokenizer that came with it."""

    path: str
    model: Any
    tokenizer: Any
    device: Any
    """Where inputs go: the model's device, or for a sharded model its first shard's."""
    dtype: Any
    device_map: dict[str, Any] | None = None
    """Module name -> device of a sharded model (accelerate's `hf_device_map`); None when the
    whole model is on `device`."""

    def describe(self) -> str:
        """The device and dtype for logs and the report, e.g. `cuda:0 (bfloat16)` or
        `cuda:0..3 (bfloat16, sharded over 4 devices)`."""
        dtype = str(self.dtype).removeprefix("torch.")
        if not self.device_map:
            return f"{self.device} ({dtype})"
        shards = list(dict.fromkeys(str(d) for d in self.device_map.values()))
        return f"{self.device} ({dtype}, sharded over {len(shards)} devices: {', '.join(shards)})"


@dataclass(frozen=True)
class Placement:
    """Where a model's weights go: one device, or shards per accelerate's device map."""

    device: Any
    """Where inputs go (the first shard's device when sharded)."""
    dtype: Any
    device_map: str | dict[str, Any] | None = None
    """None: the whole model on `device`; else an accelerate device map ("auto" or explicit)."""
    max_memory: dict[Any, str] | None = None
    """Per-device memory budget for `device_map="auto"` (accelerate's `max_memory`)."""


def _device_of(target: Any) -> Any:
    """The torch device an accelerate device-map entry names (an int is a CUDA index; "disk"
    offloaded weights are computed on CPU)."""
    import torch

    if isinstance(target, int):
        return torch.device("cuda", target)
    if str(target) == "disk":
        return torch.device("cpu")
    return torch.device(target)


def plan_placement(
    device: str | None = None,
    *,
    device_map: str | dict[str, Any] | None = None,
) -> Placement:
    """Where to put a model for evaluation.

    Args:
        device: one torch device for the whole model (default: see below).
        device_map: an explicit accelerate device map; wins over `device`.

    Default (neither given): more than one CUDA device shards over all of them
    (`device_map="auto"` with `max_memory`: `memory_fit.USABLE` of each GPU, the rest left for
    activations); one CUDA device or none puts the model on
    `pick_device()`'s device, unchanged from single-device evaluation.
    """
    import torch

    if device_map is not None:
        if isinstance(device_map, dict):
            if not device_map:
                raise ValueError("device_map is empty: map module names to devices, or use auto")
            first = _device_of(next(iter(device_map.values())))
        else:
            first = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        on_gpu = torch.cuda.is_available() and (
            not isinstance(device_map, dict)
            or any(_device_of(d).type == "cuda" for d in device_map.values())
        )
        dtype = torch.bfloat16 if on_gpu else torch.float32
        return Placement(device=first, dtype=dtype, device_map=device_map)
    if device is None and torch.cuda.device_count() > 1:
        max_memory: dict[Any, str] = {
            i: f"{int(torch.cuda.get_device_properties(i).total_memory * USABLE) // 2**20}MiB"
            for i in range(torch.cuda.device_count())
        }
        return Placement(
            device=torch.device("cuda", 0),
            dtype=torch.bfloat16,
            device_map="auto",
            max_memory=max_memory,
        )
    dev, dtype = pick_device(device)
    return Placement(device=dev, dtype=dtype)


def pick_device(device: str | None = None) -> tuple[Any, Any]:
    """The torch device and dtype to evaluate with: `device` if given, else CUDA+bf16 or CPU+fp32.

    Raises:
        RuntimeError: the pipeline gave this step GPUs (`LLMFT_EXPECT_CUDA=1`) but CUDA is
            unavailable: scoring a large model in fp32 on CPU would take hours unnoticed.
    """
    import torch

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


def _hub_error(path: str, what: str, exc: Exception) -> ValueError:
    return ValueError(
        f"{what} {path!r} is neither a local directory nor loadable from the Hugging Face Hub "
        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): pass a model "
        "directory (local or gs://) or a Hub id this machine can reach"
    )


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
"""What a save_pretrained directory holds its weights in (the config alone cannot be evaluated)."""


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
    if not any(storage.glob(storage.join(path, pattern)) for pattern in WEIGHT_FILES):
        raise ValueError(
            f"{what} path {path!r} has {MODEL_CONFIG} but no weights ({', '.join(WEIGHT_FILES)}): "
            "the model was not fully written (for a fine-tuned model: re-run `llmft train` "
            "with the same --output, which resumes from its last checkpoint and exports)"
        )


def gguf_as_directory(path: str) -> str:
    """`path` itself, or for a .gguf file its converted model directory (trainer/gguf.py)."""
    if not is_gguf(path):
        return path

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
    device_map: str | dict[str, Any] | None = None,
) -> Iterator[LoadedModel]:
    """Load the model at `path` for inference; free it (and any temporary copy) on exit.

    Args:
        path: local directory or fsspec URI written by `save_pretrained`.
        what: how to name the model in error messages ("base model", "tuned model").
        device: torch device string; default CUDA when present, else CPU.
        tokenizer: the tokenizer to use (from `read_tokenizer`, already checked against the
            dataset); default: the one saved with the model.
        device_map: an accelerate device map to shard with; default: all GPUs when there are
            several, else one device (`plan_placement`).
    """
    check_model_path(path, what)
    placement = plan_placement(device, device_map=device_map)
    dev, dtype = placement.device, placement.dtype
    with local_copy(gguf_as_directory(path)) as local_dir:
        if tokenizer is None:
            if not is_hub_id(local_dir) and not _has_tokenizer(local_dir):
                raise ValueError(
                    f"{what} {path!r} has no tokenizer files (tokenizer.json / "
                    "tokenizer_config.json): save the tokenizer next to the model"
                )
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(local_dir)
        with tempfile.TemporaryDirectory(prefix="llmft-eval-offload-") as offload:
            try:
                model = _from_pretrained(local_dir, placement, offload)
            except OSError as exc:
                if is_hub_id(local_dir):
                    raise _hub_error(path, what, exc) from None
                raise
            model.eval()
            shards = getattr(model, "hf_device_map", None) if placement.device_map else None
            loaded = LoadedModel(
                path=path, model=model, tokenizer=tokenizer, device=dev, dtype=dtype,
                device_map=dict(shards) if shards else None,
            )  # fmt: skip
            del model
            log.info("loaded %s from %s on %s", what, path, loaded.describe())
            try:
                yield loaded
            finally:
                # Drop the weights before the next model loads: only one is resident at a time.
                loaded.model = None
                if dev.type == "cuda":
                    import torch

                    torch.cuda.empty_cache()


def _from_pretrained(local_dir: str, placement: Placement, offload_dir: str) -> Any:
    """The model on one device (`.to`, as always), or sharded by accelerate's device map."""
    from transformers import AutoModelForCausalLM

    if placement.device_map is None:
        model = AutoModelForCausalLM.from_pretrained(local_dir, dtype=placement.dtype)
        return model.to(placement.device)
    return AutoModelForCausalLM.from_pretrained(
        local_dir,
        dtype=placement.dtype,
        device_map=placement.device_map,
        max_memory=placement.max_memory,
        offload_folder=offload_dir,  # used only by "disk" entries of the map
    )
