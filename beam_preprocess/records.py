"""Element shapes and output tags shared by the transforms.

Elements are plain dicts/tuples of str, int and bytes so Beam's fast primitive coder handles them
without pickling (it matters at tens of thousands of records per second).

    record   {"source": "path:line", "record": {...raw fields...}}
    example  {"source": ..., "messages": [{"role", "content"}, ...]}  (instruction data)
             {"source": ..., "text": "..."}                           (plain text)
             {"source": ..., "messages": [history], "chosen": "...", "rejected": "..."}
                                                                      (preference pairs)
             plus "hash" (content hash) and "split" ("train" | "eval"), set by Prepare
    document (ids int32 bytes, loss mask uint8 bytes)
    tokenized example (hash, source, split, [documents], retokenized, eval record or None);
             Tokenize emits (bucket, [tokenized examples]) per batch and bucket (Beam's cost is
             per element, so they travel in lists)
"""

from __future__ import annotations

import json
from typing import Any

DEAD = "dead"
"""Tag: records that cannot be used because they are broken (rejected/)."""
FILTERED = "filtered"
"""Tag: valid records removed by a policy (too long, too short) (filtered/)."""
READ = "read"
"""Tag: number of records read per file."""
READ_FILES = "read_files"
"""Tag: (path, records read) per file range (a weighted mix's records read per source)."""
OUTCOME = "outcome"
"""Tag: (event, count) of what became of input records: "kept", "duplicate", "rejected/<reason>",
"filtered/<reason>" (counted per batch where a step decides on many at once)."""
EVAL_RECORDS = "eval_records"
"""Tag: the clean held-out records (prompt/response or text) for the evaluator."""
TOO_LONG = "too_long_tokens"
"""The filter reason of an example longer than seq_len (instruction data, pairs, prompts)."""
UNUSED_FIELDS = "unused_fields"
"""Tag: [(field, records)] of fields records held but their shape did not use (per bundle)."""
STATS = "stats"
"""Tag: per-split packing statistics."""
RETOKENIZED = "retokenized"
"""Tag: sources of kept records re-encoded at the prompt/answer boundary (beam_preprocess.tokenize)."""


def dead_letter(source: str, record: Any, reason: str, error: str = "") -> dict[str, Any]:
    """The dead-letter line format of rejected/ and filtered/ (see trainer.packed_data.format)."""
    return {"source": source, "record": record, "reason": reason, "error": error}


def outcome(kind: str, reason: str = "", count: int = 1) -> tuple[str, int]:
    """An OUTCOME event: `count` records became `kind` (for `reason`)."""
    return (f"{kind}/{reason}" if reason else kind, count)


def has_lone_surrogate(value: Any) -> bool:
    """True when a parsed JSON value holds a lone UTF-16 surrogate (from an escape such as
    `\\ud800`) in a string or key: not text, as no later step could encode it as UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
