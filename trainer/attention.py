"""Per-document causal attention for packed rows, without an L x L mask when documents are short.

transformers 5 makes packed rows safe by turning `position_ids` into a block-diagonal [B, 1, L, L]
mask for SDPA. That is correct but slow: the masked kernel still computes all L^2 scores, and on
CPU (and for GPU SDPA with an explicit mask) it cannot use the fused causal path. Instruction data
packs dozens of short documents per row, so almost all of those scores are masked out.

This module regroups the tokens of a batch by document into a [documents, max_len] layout (each
document left-aligned, zero-padded at its end) and runs SDPA with `is_causal=True` there: a query
never sees the padding that follows it, so the result is exact, and the cost is
documents x max_len^2 / 2 instead of B x L^2. When that would not be cheaper (one long document, a
long padding segment), it falls back to SDPA with the block-diagonal mask, computed once per
forward. Rows that each hold one document need neither: causal SDPA on the batch as it is (the
flash kernel on GPU).

Model families pass their attention variants as keyword arguments, and this module honours each
one exactly as transformers' eager attention does (the conformance suite in
tests/test_model_families.py compares every family with the model's own forward):
`sliding_window` (Mistral, Qwen2/3, Gemma2/3, Phi-3, gpt-oss: a query sees the last `window`
positions of its document) becomes a banded mask; `softcap` (Gemma2's attention-logit
soft-capping) and `s_aux` (gpt-oss's attention sinks: one extra logit per head in the softmax) need
the scores themselves, so those layers compute attention explicitly on the same layout.

Registered with transformers as attention implementation "llmft_document"; the layout is computed
once per forward in `CausalLMLoss` and reaches every layer through the model's **kwargs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.nn import functional as F

from trainer.attention_support import support_errors

NAME = "llmft_document"
_SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}


_contiguous_inputs = False
"""Set while cuDNN's kernel is preferred: it takes [B, H, L, D] inputs only in a dense layout, not
the transposed views of [B, L, H, D] projections that attention layers pass."""


@contextlib.contextmanager
def sdpa_kernels(setting: str) -> Iterator[None]:
    """Context in which SDPA tries the kernels of `setting` (TrainConfig.sdpa_kernels) in its
    order; "auto" leaves PyTorch's own order. Compiled blocks see it too: the attention call is
    outside their graphs (`document_attention` is not compiled)."""
    global _contiguous_inputs
    if setting == "auto":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, _SDPA_BACKENDS[name]) for name in setting.split(",")]
    _contiguous_inputs = backends[0] == SDPBackend.CUDNN_ATTENTION
    try:
        with sdpa_kernel(backends, set_priority=True):
            yield
    finally:
        _contiguous_inputs = False


@dataclass
class DocumentLayout:
    """Where each token of a packed batch goes in the per-document layout."""

    slots: torch.Tensor | None
    """[B x L] index of each token in the flattened [documents x max_len] layout; None = dense."""
    documents: int
    max_len: int
    mask: torch.Tensor | None
    """Dense fallback: [B, 1, L, L] bool, True where attention is allowed; None with `slots` None:
    one document per row, plain causal attention on the batch as it is."""
    sources: torch.Tensor | None = None
    """[documents x max_len] the token each slot of the layout reads: `slots` inverted, and for
    the padding after a document the first token of the batch (any finite value will do: causal
    attention never lets a real query see the padding that follows it)."""

    def to(self, device: torch.device | str, non_blocking: bool = False) -> DocumentLayout:
        """A copy whose tensors are on `device`.

        accelerate's hooks move a layer's kwargs with `send_to_device`, which calls `.to` on
        any object that has one: this is what moves the layout with the hidden states when a
        model's layers are spread over several GPUs (device_map="auto").
        """

        def moved(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return replace(
            self, slots=moved(self.slots), mask=moved(self.mask), sources=moved(self.sources)
        )


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def document_layout(position_ids: torch.Tensor, multiple: int | None = None) -> DocumentLayout:
    """Layout of a [B, L] batch whose positions restart at 0 at every document.

    `multiple` rounds the layout's two sizes up; None: 8 on GPU (the setting its figures were
    measured with), 1 elsewhere, where the CPU flash kernel's cost follows the exact length
    (80 documents of 19 tokens: 3.5 ms forward + backward at length 19, 5.0 ms at 24).
    """
    if multiple is None:
        multiple = 8 if position_ids.is_cuda else 1
    batch, length = position_ids.shape
    flat = position_ids.reshape(-1)
    starts = flat == 0
    starts[::length] = True  # a row always starts a new segment
    doc = torch.cumsum(starts.long(), 0) - 1
    segments = int(doc[-1]) + 1
    if segments == batch:  # one document per row (long-document pre-training)
        return DocumentLayout(None, batch, length, None)
    index = torch.arange(flat.numel(), device=flat.device)
    start_of = torch.zeros(segments, dtype=torch.long, device=flat.device)
    start_of[doc[starts]] = index[starts]
    offset = index - start_of[doc]
    documents = _round_up(segments, multiple)
    max_len = _round_up(int(offset.max()) + 1, multiple)
    # Causal SDPA skips the upper triangle, the masked kernel computes every score: the regrouped
    # layout wins while it holds less than twice the dense score count.
    if documents * max_len * max_len < 2 * batch * length * length:
        slots = doc * max_len + offset
        sources = torch.zeros(documents * max_len, dtype=torch.long, device=flat.device)
        sources[slots] = index
        return DocumentLayout(slots, documents, max_len, None, sources)
    same_doc = doc.view(batch, length, 1) == doc.view(batch, 1, length)
    causal = torch.ones(length, length, dtype=torch.bool, device=flat.device).tril()
    return DocumentLayout(None, documents, max_len, (same_doc & causal).unsqueeze(1))


class _ToSlots(torch.autograd.Function):
    """tokens [N, ...] -> layout [documents x max_len, ...]: one gather forward, one backward.

    What autograd would do for the same result (a zero-filled layout, the tokens copied in) costs
    a fill, a copy and a scatter forward; this reads each slot's source token instead. Backward
    keeps only the gradients of the tokens' own slots: those of the padding slots are exactly 0
    (no real query attends to them, and their own outputs are dropped), so nothing is lost.
    """

    @staticmethod
    def forward(ctx: Any, tokens: torch.Tensor, sources: torch.Tensor, slots: torch.Tensor):
        ctx.save_for_backward(slots)
        return tokens.index_select(0, sources)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        (slots,) = ctx.saved_tensors
        return grad.index_select(0, slots), None, None


def _to_documents(x: torch.Tensor, layout: DocumentLayout) -> torch.Tensor:
    """[B, H, L, D] -> [documents, H, max_len, D]."""
    assert layout.slots is not None and layout.sources is not None
    batch, heads, length, dim = x.shape
    tokens = x.transpose(1, 2).reshape(batch * length, heads, dim)
    out = _ToSlots.apply(tokens, layout.sources, layout.slots)
    return out.view(layout.documents, layout.max_len, heads, dim).transpose(1, 2)


# Kept out of torch.compile graphs: the layout's sizes change from batch to batch, and compiling
# them would recompile the decoder blocks; the blocks' other ops keep static shapes.
@torch.compiler.disable
def document_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    document_layout: DocumentLayout | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: returns ([B, L, H, D], None)."""
    if document_layout is None:
        raise ValueError("llmft_document attention needs document_layout=... (see CausalLMLoss)")
    dropout = dropout if module.training else 0.0
    layout = document_layout
    batch, heads, length, dim = query.shape
    if layout.slots is None:
        q, k, v, allowed = query, key, value, layout.mask
    else:
        q, k, v = (_to_documents(x, layout) for x in (query, key, value))
        allowed = None  # causal within each document row
    size = q.shape[2]
    if sliding_window is not None and sliding_window < size:
        # transformers' sliding_window_overlay: key j is visible from query i iff i - j < window.
        index = torch.arange(size, device=q.device)
        band = index.view(-1, 1) - index.view(1, -1)
        band = (band >= 0) & (band < sliding_window)
        allowed = band if allowed is None else allowed & band
    if softcap is not None or s_aux is not None:
        if allowed is None:
            allowed = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        out = _explicit_attention(q, k, v, allowed, scaling, dropout, softcap, s_aux)
    else:
        if _contiguous_inputs:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, is_causal=allowed is None, dropout_p=dropout,
            scale=scaling, enable_gqa=q.shape[1] != k.shape[1],
        )  # fmt: skip
    if layout.slots is None:
        return out.transpose(1, 2).contiguous(), None
    tokens = out.transpose(1, 2).reshape(layout.documents * layout.max_len, heads, dim)
    return tokens.index_select(0, layout.slots).view(batch, length, heads, dim), None


def _explicit_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor,
    scaling: float | None,
    dropout: float,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Attention with soft-capped scores and/or sinks, in the order transformers' eager uses:
    scale -> soft-cap -> mask -> (append the sink logit) -> softmax (-> drop the sink column)."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    if sinks is not None:
        sink = sinks.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[2], 1)
        scores = torch.cat([scores, sink.to(scores.dtype)], dim=-1)
        scores = scores - scores.max(dim=-1, keepdim=True).values
        probs = F.softmax(scores, dim=-1, dtype=scores.dtype)[..., :-1]
    else:
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = F.dropout(probs, p=dropout, training=dropout > 0)
    return torch.matmul(probs.to(value.dtype), value)


def _no_mask(*args, **kwargs) -> None:
    """The layout replaces the mask: transformers must not build an L x L one."""
    return None


def register() -> None:
    """Make "llmft_document" a valid `attn_implementation` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, document_attention)
    AttentionMaskInterface.register(NAME, _no_mask)


@contextlib.contextmanager
def document_attention_in(model: Any) -> Iterator[bool]:
    """Run a loaded *ForCausalLM with "llmft_document" attention inside the block (yields True),
    or unchanged where that attention does not apply (yields False); restored on exit, since
    generation needs the model's own attention. Used to score packed rows exactly."""
    if support_errors("document", model.config):
        yield False
        return
    previous = model.config._attn_implementation
    register()
    model.set_attn_implementation(NAME)
    try:
        yield True
    finally:
        model.set_attn_implementation(previous)


def implementation(setting: str, hf_config: Any) -> str:
    """The transformers `attn_implementation` for TrainConfig.attention on this model.

    Raises:
        ValueError: the setting would not be exact for this model (the message says what to set).
    """
    errors = support_errors(setting, hf_config)
    if errors:
        raise ValueError("; ".join(errors))
    if setting == "document":
        register()
        return NAME
    return setting
