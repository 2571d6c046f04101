"""The last decoder block's post-attention norm and MLP on target positions only.

After the last block's attention, everything up to the LM head works position by position: the
block's post-attention norm and MLP, then the decoder's final norm. The loss reads only the
positions whose next token is a target (~22% of them for instruction data), so the last block
runs attention on the whole sequence (its keys and values need every position) and the rest only
on those rows; the decoder's final norm then sees only them. Same result, ~8% fewer FLOPs for
the benchmark's 7-layer model (docs/performance.md, "Last block on target positions only").

Only for decoder layers whose forward is exactly
`h = x + self_attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h))`, inside
decoders whose forward ends with `norm(last block's output)`: listed by class below (checked
against transformers 5.24's sources), never guessed from attribute names. Anything else takes
the full path: other families, a layer class that overrides `forward`, HF's own gradient
checkpointing, and a block under per-block `torch.compile` (config.compile: the number of target
rows changes every batch, and each new size would recompile the block's graph).

How: the known layer's `forward` becomes `forward_on_rows` (instance attribute, installed on
first use), which is the class's own forward unless the `ROWS` keyword is given. The decoder
hands its keywords to every layer, so the selection reaches the last one the way
`document_layout` reaches attention. The block module itself is still what the decoder calls, so
FSDP2's per-block hooks fire (its parameters are gathered first) and DDP sees one graph; under
activation checkpointing (`checkpoint_wrapper`) the recompute in backward gets the same keywords
and so computes the same rows.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

ROWS = "llmft_target_rows"
"""Keyword naming the rows (flat indices into batch x length) the last block returns."""


@functools.cache
def _known_forwards() -> tuple[frozenset[Callable[..., Any]], frozenset[Callable[..., Any]]]:
    """(decoder forwards, layer forwards), unwrapped: the families where the fast path is exact."""
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3

    decoders: list[Any] = [
        modeling_llama.LlamaModel,
        modeling_mistral.MistralModel,
        modeling_qwen2.Qwen2Model,
        modeling_qwen3.Qwen3Model,
    ]
    layers: list[Any] = [
        modeling_llama.LlamaDecoderLayer,
        modeling_mistral.MistralDecoderLayer,
        modeling_qwen2.Qwen2DecoderLayer,
        modeling_qwen3.Qwen3DecoderLayer,
    ]
    return (
        frozenset(inspect.unwrap(c.forward) for c in decoders),
        frozenset(inspect.unwrap(c.forward) for c in layers),
    )


def last_layer(decoder: Any) -> nn.Module | None:
    """The last decoder layer when the fast path is exact for it (installed), else None.

    Looks through `checkpoint_wrapper`; FSDP2's `FSDP<Layer>` subclass wraps the same forward,
    so `inspect.unwrap` finds the listed class's function under it.
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    decoder_forwards, layer_forwards = _known_forwards()
    if inspect.unwrap(type(decoder).forward) not in decoder_forwards:
        return None
    layers = decoder.layers
    if not isinstance(layers, nn.ModuleList) or len(layers) != decoder.config.num_hidden_layers:
        return None
    layer = layers[-1]
    while isinstance(layer, CheckpointWrapper):
        layer = layer._checkpoint_wrapped_module
    if inspect.unwrap(type(layer).forward) not in layer_forwards or layer.gradient_checkpointing:
        return None
    installed = layer.__dict__.get("forward")
    if not (isinstance(installed, functools.partial) and installed.func is forward_on_rows):
        layer.__dict__["forward"] = functools.partial(forward_on_rows, layer)
    return layer


def target_rows(loss_mask: torch.Tensor) -> torch.Tensor:
    """Flat indices (into batch x length) of the positions whose next token is a target."""
    select = nn.functional.pad(loss_mask[:, 1:].bool(), (0, 1))
    return torch.nonzero(select.flatten()).squeeze(1)


def forward_on_rows(layer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The layer's own forward; with `ROWS`, its output [1, rows, hidden] at those rows only."""
    rows = kwargs.pop(ROWS, None)
    if rows is None:
        return type(layer).forward(layer, *args, **kwargs)
    return _on_rows(layer, rows, *args, **kwargs)


def _on_rows(
    layer: Any,
    rows: torch.Tensor,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: Any = None,
    use_cache: bool | None = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """LlamaDecoderLayer.forward (transformers 5.24), the residual's consumers on `rows` only."""
    residual = hidden_states
    hidden_states, _ = layer.self_attn(
        hidden_states=layer.input_layernorm(hidden_states),
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    # [1, rows, hidden]: the output is a new tensor, not a view (FSDP2 hooks the block's output).
    hidden_states = (residual + hidden_states).flatten(0, 1)[rows].unsqueeze(0)
    return hidden_states + layer.mlp(layer.post_attention_layernorm(hidden_states))
