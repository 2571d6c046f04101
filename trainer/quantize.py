"""QLoRA's frozen base: the decoder blocks' linear weights as 4-bit NormalFloat (NF4).

`quantize_base: nf4` (trainer/config.py). Every `nn.Linear` inside a decoder block whose weight is
frozen (the base layer under each LoRA adapter, and the linears LoRA does not target) gets its
weight replaced by torchao's `NF4Tensor` (Dettmers et al. 2023, QLoRA: 64-value blocks with an
absmax scale each, the scales themselves quantized to 8 bits in blocks of 256). `F.linear` on an
NF4 weight de-quantizes it to the input's dtype for the matmul and for the input gradient (the
weight gets none), which is how torchtune's QLoRA recipes run; the NF4 tensor also implements
FSDP2's all-gather extension, so sharding keeps the weights 4-bit in flight.

Embeddings, norms and the LM head stay in full precision (frozen: cast to the compute dtype). The
quantization is deterministic: `nf4_round_trip` of a base weight is exactly what the trained model
multiplies by, so the export can rebuild the de-quantized base from the checkpoint on disk instead
of gathering 4-bit shards (trainer/export.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used: trainer/memory_model.py stays torch-free
    import torch
    from torch import nn

BLOCK_SIZE = 64
"""Weights per absmax scale: QLoRA's (and torchtune's, torchao's) default."""
SCALER_BLOCK_SIZE = 256
"""Scales per 8-bit double-quantization block: QLoRA's default. Matrices whose block count it does
not divide (tiny test models) use its largest divisor below it."""


def _nf4() -> Any:
    """torchao's NF4 module (moved from torchao.dtypes in 0.18)."""
    from torchao.quantization.quantize_.workflows.nf4 import nf4_tensor

    return nf4_tensor


def scaler_block_size(numel: int) -> int:
    """The double-quantization block for a matrix of `numel` values (SCALER_BLOCK_SIZE when the
    block count allows, as it does for every real model's matrices)."""
    blocks = numel // BLOCK_SIZE
    return max(d for d in range(1, SCALER_BLOCK_SIZE + 1) if blocks % d == 0)


def quantizable(weight: torch.Tensor) -> bool:
    """Whether NF4 can hold this matrix (whole 64-value blocks)."""
    return weight.ndim == 2 and weight.numel() % BLOCK_SIZE == 0


def to_nf4(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`weight` (any dtype) as an NF4 tensor that de-quantizes to `dtype`."""
    return _nf4().to_nf4(
        weight.detach().to(dtype).contiguous(),
        block_size=BLOCK_SIZE,
        scaler_block_size=scaler_block_size(weight.numel()),
    )


def nf4_round_trip(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What a quantized `weight` multiplies by: NF4 then back to `dtype` (exact, deterministic)."""
    nf4: Any = to_nf4(weight, dtype)
    return nf4.get_original_weight()


def is_nf4(tensor: Any) -> bool:
    return isinstance(tensor, _nf4().NF4Tensor)


def frozen_linears(blocks: nn.ModuleList) -> list[tuple[str, nn.Linear]]:
    """(name under `blocks`, module) of every quantizable linear with a frozen weight."""
    from torch import nn

    return [
        (name, module)
        for name, module in blocks.named_modules()
        if type(module) is nn.Linear
        and not module.weight.requires_grad
        and quantizable(module.weight)
    ]


def quantize_blocks(
    root: nn.Module,
    blocks: nn.ModuleList,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> list[str]:
    """Replace the frozen linear weights of `blocks` (materialized, loaded) by NF4 tensors on
    `device` that de-quantize to `dtype`, and cast the other frozen floating-point parameters of
    `root` to `dtype`. One matrix at a time goes to `device` in full precision, so a GPU
    quantizes a base that would not fit it unquantized. Returns the quantized weights' names in
    `root` (its state-dict keys)."""
    import torch
    from torch import nn

    prefix = next(name for name, module in root.named_modules() if module is blocks)
    quantized = []
    for name, linear in frozen_linears(blocks):
        weight = to_nf4(linear.weight.to(device), dtype)
        linear.weight = nn.Parameter(weight, requires_grad=False)
        quantized.append(f"{prefix}.{name}.weight")
    done = set(quantized)
    with torch.no_grad():
        for name, param in root.named_parameters():
            if name not in done and not param.requires_grad and param.is_floating_point():
                param.data = param.data.to(dtype)
    return quantized


def round_trip_blocks(root: nn.Module, blocks: nn.ModuleList, dtype: torch.dtype) -> list[str]:
    """In place, the weights `quantize_blocks` would give `root`, de-quantized: the frozen linear
    weights of `blocks` become their `nf4_round_trip` and the other frozen floating-point
    parameters are rounded to `dtype`, each kept in its own dtype and on its device. Applied to
    the base model (all parameters frozen), this is a QLoRA run's DPO reference, the base with
    its adapters off as the trainer multiplied by (trainer/export.py's `dequantized_base` is the
    same for a state dict). Returns the round-tripped linear weights' names in `root`."""
    import torch

    prefix = next(name for name, module in root.named_modules() if module is blocks)
    linears = frozen_linears(blocks)
    done = {id(linear.weight) for _, linear in linears}
    with torch.no_grad():
        for _, linear in linears:
            weight = linear.weight
            weight.data = nf4_round_trip(weight.data, dtype).to(weight.dtype)
        for param in root.parameters():
            if id(param) not in done and not param.requires_grad and param.is_floating_point():
                param.data = param.data.to(dtype).to(param.dtype)
    return [f"{prefix}.{name}.weight" for name, _ in linears]


def quantized_modules(root: nn.Module) -> list[nn.Module]:
    """The modules that hold an NF4 weight (DDP must not broadcast or bucket them)."""
    # Own parameters only: peft's LoRA layer exposes its base layer's weight as `.weight` too.
    return [m for m in root.modules() if is_nf4(m._parameters.get("weight"))]


def nf4_bytes(numel: int) -> float:
    """Bytes of an NF4 matrix of `numel` values: 4 bits each, one 8-bit scale per 64 values, one
    fp32 scale (plus mean) per 256 scales: 0.5 + 1/64 + 8/(64 x 256) = ~0.516 bytes per value."""
    blocks = numel / BLOCK_SIZE
    return numel / 2 + blocks + 4 * math.ceil(blocks / SCALER_BLOCK_SIZE)
