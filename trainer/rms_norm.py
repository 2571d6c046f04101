"""RMSNorm's forward and backward as one autograd Function, for fp32 runs outside torch.compile.

transformers' RMSNorm (`weight * (x * rsqrt(mean(x^2) + eps))`) is five element-wise ops and a
mean forward and about a dozen ops in autograd's backward, each a pass over the activations. On a CPU, where
small models run eager and element-wise passes are bound by memory traffic, that is ~2.5% of a
step of the benchmark's 7M Llama (docs/performance.md, "RMSNorm as one autograd Function").
Here the forward is the same ops in the same order (bit-identical output), and backward is five
passes: with y = x * r * w, r = rsqrt(mean(x^2) + eps) and g the gradient of y,

    dx = r * (g*w - (x*r) * mean(g*w * x*r))        dw = sum over positions of g * (x*r)

(equal to autograd's to fp32 rounding). Compiled code (GPU's default) fuses the class's own ops
better than a Function would let it, and bf16 would need the class's casts, so both keep the
class's forward. Where fp32 weights run under bf16 autocast (the replicated GPU layout: the
residual stream stays fp32) the Function runs for the norms outside compiled blocks; autocast
changes none of its forward ops (pow and rsqrt are fp32 under autocast, as in the class), and
its backward runs with autocast off.

Installed per module, like trainer/last_block.py: only instances of the classes listed below
(their forward checked against transformers 5.24's sources: the same six lines in each), never
found by attribute names. `install(model)` returns how many it replaced.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


@functools.cache
def _known_forwards() -> frozenset[Callable[..., Any]]:
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3

    classes: list[Any] = [
        modeling_llama.LlamaRMSNorm,
        modeling_mistral.MistralRMSNorm,
        modeling_qwen2.Qwen2RMSNorm,
        modeling_qwen3.Qwen3RMSNorm,
    ]
    return frozenset(inspect.unwrap(c.forward) for c in classes)


def install(model: nn.Module) -> int:
    """Give each listed RMSNorm in `model` the one-Function forward; the number replaced."""
    known = _known_forwards()
    count = 0
    for module in model.modules():
        if inspect.unwrap(type(module).forward) in known:
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
            count += 1
    return count


def _forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    assert isinstance(weight, torch.Tensor)
    if (
        hidden_states.dtype != torch.float32
        or weight.dtype != torch.float32
        or torch.compiler.is_compiling()
    ):
        return type(self).forward(self, hidden_states)
    return _RMSNorm.apply(hidden_states, weight, self.variance_epsilon)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # The class's ops in its order: pow, mean, + eps, rsqrt, x * r, weight * (x * r).
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        normed = x * r
        ctx.save_for_backward(normed, weight, r)
        return weight * normed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        normed, weight, r = ctx.saved_tensors
        grad_x = grad_w = None
        with torch.autocast(grad.device.type, enabled=False):  # vecdot would run in bf16
            if ctx.needs_input_grad[1]:  # frozen under LoRA
                width = grad.shape[-1]
                grad_w = torch.linalg.vecdot(
                    grad.reshape(-1, width), normed.reshape(-1, width), dim=0
                )
            if ctx.needs_input_grad[0]:
                gw = grad * weight
                mean = torch.linalg.vecdot(gw, normed).unsqueeze(-1).div_(grad.shape[-1])
                grad_x = torch.addcmul(gw, normed, mean, value=-1).mul_(r)
        return grad_x, grad_w, None
