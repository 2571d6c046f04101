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
forward.

Registered with transformers as attention implementation "llmft_document"; the layout is computed
once per forward in `CausalLMLoss` and reaches every layer through the model's **kwargs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

NAME = "llmft_document"


@dataclass
class DocumentLayout:
    """Where each token of a packed batch goes in the per-document layout."""

    slots: torch.Tensor | None
    """[B x L] index of each token in the flattened [documents x max_len] layout; None = dense."""
    documents: int
    max_len: int
    mask: torch.Tensor | None
    """Dense fallback: [B, 1, L, L] bool, True where attention is allowed."""


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def document_layout(position_ids: torch.Tensor, multiple: int = 8) -> DocumentLayout:
    """Layout of a [B, L] batch whose positions restart at 0 at every document."""
    batch, length = position_ids.shape
    flat = position_ids.reshape(-1)
    starts = flat == 0
    starts[::length] = True  # a row always starts a new segment
    doc = torch.cumsum(starts.long(), 0) - 1
    index = torch.arange(flat.numel(), device=flat.device)
    start_of = torch.zeros(int(doc[-1]) + 1, dtype=torch.long, device=flat.device)
    start_of[doc[starts]] = index[starts]
    offset = index - start_of[doc]
    # Shapes are rounded up so that torch.compile sees few distinct sizes.
    documents = _round_up(int(doc[-1]) + 1, multiple)
    max_len = _round_up(int(offset.max()) + 1, multiple)
    # Causal SDPA skips the upper triangle, the masked kernel computes every score: the regrouped
    # layout wins while it holds less than twice the dense score count.
    if documents * max_len * max_len < 2 * batch * length * length:
        return DocumentLayout(doc * max_len + offset, documents, max_len, None)
    same_doc = doc.view(batch, length, 1) == doc.view(batch, 1, length)
    causal = torch.ones(length, length, dtype=torch.bool, device=flat.device).tril()
    return DocumentLayout(None, documents, max_len, (same_doc & causal).unsqueeze(1))


def _to_documents(x: torch.Tensor, layout: DocumentLayout) -> torch.Tensor:
    """[B, H, L, D] -> [documents, H, max_len, D]."""
    assert layout.slots is not None
    batch, heads, length, dim = x.shape
    tokens = x.transpose(1, 2).reshape(batch * length, heads, dim)
    out = tokens.new_zeros(layout.documents * layout.max_len, heads, dim)
    out = out.index_copy(0, layout.slots, tokens)
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
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: returns ([B, L, H, D], None)."""
    if document_layout is None:
        raise ValueError("llmft_document attention needs document_layout=... (see CausalLMLoss)")
    dropout = dropout if module.training else 0.0
    gqa = query.shape[1] != key.shape[1]
    layout = document_layout
    if layout.slots is None:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=layout.mask, dropout_p=dropout, scale=scaling,
            enable_gqa=gqa,
        )  # fmt: skip
        return out.transpose(1, 2).contiguous(), None
    batch, heads, length, dim = query.shape
    out = F.scaled_dot_product_attention(
        _to_documents(query, layout), _to_documents(key, layout), _to_documents(value, layout),
        is_causal=True, dropout_p=dropout, scale=scaling, enable_gqa=gqa,
    )  # fmt: skip
    tokens = out.transpose(1, 2).reshape(layout.documents * layout.max_len, heads, dim)
    return tokens.index_select(0, layout.slots).view(batch, length, heads, dim), None


def _no_mask(*args, **kwargs) -> None:
    """The layout replaces the mask: transformers must not build an L x L one."""
    return None


def register() -> None:
    """Make "llmft_document" a valid `attn_implementation` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, document_attention)
    AttentionMaskInterface.register(NAME, _no_mask)
