"""How many tokens a run's raw input will give, before preprocessing has run: the input's bytes
(listed where they can be) over a measured bytes-per-token figure. The cost estimate sizes the
preprocess step (and the data a run trains on) with it.
"""

from __future__ import annotations

import math

BYTES_PER_TOKEN = 2.86
"""Raw JSONL bytes per token before preprocessing: 32 MB -> 11.2M tokens in the preprocess
benchmark (8k BPE tokenizer, docs/performance.md); larger vocabularies give fewer tokens, so the
estimate errs high."""


def tokens_from_bytes(size: int) -> int:
    """Tokens expected from `size` bytes of raw records (`BYTES_PER_TOKEN`)."""
    return math.ceil(size / BYTES_PER_TOKEN)


def input_bytes(uri: str, *, remote: bool) -> int | None:
    """Total size of the raw input files (a path, glob or gs:// URI); None when it cannot be
    listed here (gs:// outside the pipeline, a placeholder, nothing matches)."""
    if not uri or "{{" in uri or ("://" in uri and not remote):
        return None
    import fsspec  # ~60 ms to import (as trainer/storage.py): only when an input is sized

    try:
        fs, _, paths = fsspec.get_fs_token_paths(uri, expand=True)
        return sum(int(fs.size(p) or 0) for p in paths if fs.isfile(p)) or None
    except (OSError, ValueError):
        return None
