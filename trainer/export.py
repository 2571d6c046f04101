"""Write the trained model as a Hugging Face directory, once, from rank 0.

Every rank takes part in gathering the full state dict to CPU (`full_state_dict=True,
cpu_offload=True` fills it on rank 0 only); rank 0 writes sharded safetensors + index, config,
generation config and tokenizer to a local directory and uploads it when the target is remote.
With LoRA it writes `adapter/` (peft's adapter format) and the merged model at the top level, so
`from_pretrained(OUTPUT/model)` works either way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer import storage
from trainer.config import TrainConfig, parse_size
from trainer.model import CausalLMLoss, load_full_state_dict, lora_config
from trainer.quantize import nf4_round_trip

log = logging.getLogger(__name__)


def gather_full_state_dict(root: CausalLMLoss) -> dict[str, torch.Tensor]:
    """Collective. Rank 0 gets the full state dict (keys without the `lm.` prefix); others {}."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # An NF4 base is not gathered: rank 0 rebuilds it, identically, from the base model.
    quantized = bool(root.quantized)
    full = get_model_state_dict(
        root,
        options=StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=quantized
        ),
    )
    if dist.get_rank() != 0:
        return {}
    if quantized:
        full = {**dequantized_base(root), **full}
    return {k.removeprefix("lm."): v for k, v in full.items() if isinstance(v, torch.Tensor)}


def dequantized_base(root: CausalLMLoss) -> dict[str, torch.Tensor]:
    """The frozen weights a QLoRA model trained with, full precision (keys like `CausalLMLoss`):
    the base model's weights through the same NF4 quantization and back, the other frozen weights
    in the compute dtype (trainer/quantize.py)."""
    assert root.base_source is not None, "a quantized model records where its base came from"
    config, model_dir, dtype = root.base_source
    # Loaded in the compute dtype, as for training, and round-tripped one tensor at a time (each
    # source tensor dropped as its result is made): host memory stays one copy of the base in
    # that dtype (a 7B base in bf16: 14 GB; it was an fp32 copy plus the result, 42 GB).
    base = load_full_state_dict(config, model_dir, dtype)
    names = set(root.quantized)
    out = {}
    for key in list(base):
        value = base.pop(key)
        out[key] = nf4_round_trip(value, dtype) if key in names else value.to(dtype)
    return out


def save_safetensors(
    state_dict: dict[str, torch.Tensor], out: Path, max_shard_size: int
) -> list[str]:
    """Sharded safetensors + model.safetensors.index.json, as `save_pretrained` lays them out."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    split = split_torch_state_dict_into_shards(state_dict, max_shard_size=max_shard_size)
    for filename, names in split.filename_to_tensors.items():
        save_file(
            {n: state_dict[n].contiguous() for n in names},
            out / filename,
            metadata={"format": "pt"},
        )
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return list(split.filename_to_tensors)


def export_model(
    root: CausalLMLoss, config: TrainConfig, model_dir: str, target: str, tokenizer: Any
) -> None:
    """Collective. Writes `target` (local or fsspec URI) on rank 0."""
    full = gather_full_state_dict(root)
    full_disk = [""]  # rank 0's DiskFullError, told to every rank so that all stop alike
    if dist.get_rank() == 0:
        try:
            with tempfile.TemporaryDirectory(prefix="llmft-export-") as tmp:
                with storage.disk_errors_named(tmp):
                    _write(full, config, model_dir, Path(tmp), tokenizer)
                _publish(Path(tmp), target)  # all or nothing (storage.upload_dir)
            log.info("exported the model to %s", target)
        except storage.DiskFullError as exc:
            full_disk = [str(exc)]
    dist.broadcast_object_list(full_disk, src=0)  # also the barrier after the export
    if full_disk[0]:
        raise storage.DiskFullError(full_disk[0])


def _write(
    full: dict[str, torch.Tensor], config: TrainConfig, model_dir: str, out: Path, tokenizer: Any
) -> None:
    from transformers import AutoConfig, GenerationConfig

    hf_config = AutoConfig.from_pretrained(model_dir)
    dtype = getattr(hf_config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    shard = parse_size(config.export_shard_size)
    if config.lora_rank:
        full = _save_adapter_and_merge(full, config, hf_config, out)
    weights = {k: v.to(dtype) if v.is_floating_point() else v for k, v in full.items()}
    if getattr(hf_config, "tie_word_embeddings", False):
        weights.pop("lm_head.weight", None)  # the embedding is the head; save it once
    save_safetensors(weights, out, shard)
    hf_config.save_pretrained(out)
    # A base model without generation_config.json gets none in the export either.
    with contextlib.suppress(OSError):
        GenerationConfig.from_pretrained(model_dir).save_pretrained(out)
    tokenizer.save_pretrained(out)


def _save_adapter_and_merge(
    full: dict[str, torch.Tensor], config: TrainConfig, hf_config: Any, out: Path
) -> dict[str, torch.Tensor]:
    """Write OUTPUT/model/adapter and return the merged (plain) state dict."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    peft_model = get_peft_model(base, lora_config(config))
    peft_model.load_state_dict(full, assign=True, strict=True)
    peft_model.peft_config["default"].base_model_name_or_path = config.model
    peft_model.save_pretrained(out / "adapter")
    merged = peft_model.merge_and_unload()
    return {k: v.detach() for k, v in merged.state_dict().items()}


def _publish(local: Path, target: str) -> None:
    storage.upload_dir(local, target)
