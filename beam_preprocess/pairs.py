"""Preference pairs -> packed rows for DPO (no Beam, no torch): the functions both ways of making
a preference dataset call (the Beam graph's beam_preprocess/preference_steps.py, and
beam_preprocess/preference.py's in-memory `write_dataset`).

Accepted records (JSON objects; the shapes TRL's preference datasets use):

    {"prompt": "...", "chosen": "...", "rejected": "..."}                  a single-turn pair
    {"prompt": [messages], "chosen": [messages], "rejected": [messages]}    conversational, the
                                                                             responses one
                                                                             assistant message
    {"chosen": [messages], "rejected": [messages]}                          chat pairs: the same
                                                                             history, a different
                                                                             last assistant turn

Any of them may add a top-level "system" text (as instruction records do): it becomes the
history's first turn, unless the history starts with a system turn of its own.

Each side is rendered with the tokenizer's chat template exactly as for instruction data: the
prompt is `apply_chat_template(history, add_generation_prompt=True)` and the response's tokens
(what the conversation adds after it, end-of-turn included) are the only targets. A pair is
packed whole into one row, chosen then rejected, each a document of its own (positions restart,
the first token is no target) and tagged in the `pair_ids` column (2k+1 chosen, 2k+2 rejected for
the row's k-th pair; trainer/packed_data/format.py). Pairs longer than seq_len together are
filtered (reason "too_long_tokens"): truncating one side would bias its log-probability.

Packing is first-fit decreasing over pair lengths, ties in the given order (the Beam graph gives
source order), so the rows are deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.packed_data.format import PAIR_COLUMN, PREFERENCE_KIND, row_columns, table_schema

Document = tuple[list[int], list[int]]
"""(token ids, loss mask) of one rendered conversation."""


class PairError(ValueError):
    """A record that cannot become a pair; `reason` is the dead-letter reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Pair:
    chosen: Document
    rejected: Document

    def __len__(self) -> int:
        return len(self.chosen[0]) + len(self.rejected[0])


SYSTEM_FIELD = "system"
"""A record's optional system prompt, the same field instruction records have
(beam_preprocess.shapes.SYSTEM_FIELD is this one)."""
PAIR_FIELDS = ("prompt", "chosen", "rejected", SYSTEM_FIELD)
"""The fields a preference record's shape reads (each one optional: see the module docstring)."""
PAIR_KEYS = ("chosen", "rejected")
"""An example's response texts besides its `messages` (the history), beam_preprocess.records."""
_ROLES = ("system", "user", "assistant")


def normalize(record: dict[str, Any]) -> tuple[list[dict[str, str]], str, str]:
    """(history, chosen text, rejected text) of any accepted record shape (PairError if none),
    the record's `system` text first in the history unless it starts with a system turn."""
    history, chosen, rejected = _normalize(record)
    system = record.get(SYSTEM_FIELD)
    if system is not None and not isinstance(system, str):
        raise PairError(
            "invalid_field_type", f"field {SYSTEM_FIELD!r} is {type(system).__name__}, not text"
        )
    if system and system.strip() and history[0]["role"] != "system":
        history = [{"role": "system", "content": system}, *history]
    return history, chosen, rejected


def _normalize(record: dict[str, Any]) -> tuple[list[dict[str, str]], str, str]:
    chosen, rejected = record.get("chosen"), record.get("rejected")
    prompt = record.get("prompt")
    if isinstance(chosen, str) and isinstance(rejected, str):
        if isinstance(prompt, str):
            history = [{"role": "user", "content": prompt}]
            return history, _response(chosen), _response(rejected)
        if isinstance(prompt, list):
            return _history(prompt), _response(chosen), _response(rejected)
    if isinstance(chosen, list) and isinstance(rejected, list) and chosen and rejected:
        if isinstance(prompt, str):
            raise PairError(
                "pair_shape",
                "the prompt is text but chosen and rejected are message lists: give the prompt "
                "as messages too, or chosen and rejected as text",
            )
        if isinstance(prompt, list) and (len(chosen) != 1 or len(rejected) != 1):
            # Taking the first message would silently drop the rest of the completion.
            raise PairError(
                "pair_shape",
                "with a prompt given as messages, chosen and rejected must each be one assistant "
                f"message (got {len(chosen)} and {len(rejected)})",
            )
        history = list(prompt) if isinstance(prompt, list) else chosen[:-1]
        if not isinstance(prompt, list) and chosen[:-1] != rejected[:-1]:
            raise PairError("pair_history", "chosen and rejected differ before their last turn")
        last_chosen = chosen[-1] if not isinstance(prompt, list) else chosen[0]
        last_rejected = rejected[-1] if not isinstance(prompt, list) else rejected[0]
        for message in (last_chosen, last_rejected):
            if not isinstance(message, dict) or message.get("role") != "assistant":
                raise PairError("pair_shape", "the responses must be assistant messages")
        texts = [_response(m.get("content")) for m in (last_chosen, last_rejected)]
        return _history(history), texts[0], texts[1]
    raise PairError(
        "pair_shape",
        'a preference record has "chosen" and "rejected" (strings with a "prompt", or message '
        "lists)",
    )


def _response(text: Any) -> str:
    if not isinstance(text, str):
        raise PairError("pair_shape", f"a response is {type(text).__name__}, not text")
    if not text.strip():
        raise PairError("empty_response", "a response is empty")
    return text


def _history(messages: list[Any]) -> list[dict[str, str]]:
    """The prompt's turns as {role, content} (PairError when one is not a chat message)."""
    history = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role not in _ROLES or not isinstance(content, str):
            raise PairError(
                "pair_shape",
                f"prompt turn {i} is not a chat message (role one of {', '.join(_ROLES)}, "
                "content text)",
            )
        history.append({"role": role, "content": content})
    if not history:
        raise PairError("pair_shape", "the prompt is empty")
    return history


def example_of(record: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the example {"messages": history, "chosen", "rejected"}, the fields it was made of) of a
    preference record (beam_preprocess.shapes' `preference` shape); raises PairError."""
    history, chosen, rejected = normalize(record)
    used = tuple(name for name in PAIR_FIELDS if name in record)
    return {"messages": history, "chosen": chosen, "rejected": rejected}, used


def is_pair(example: dict[str, Any]) -> bool:
    """Whether an example (beam_preprocess.records) is a preference pair."""
    return PAIR_KEYS[0] in example


def record_of(example: dict[str, Any]) -> dict[str, Any]:
    """A pair example as a preference record again (for dead letters): `prompt` is the text of a
    single user turn, else the list of turns."""
    history = example["messages"]
    single = len(history) == 1 and history[0]["role"] == "user"
    prompt = history[0]["content"] if single else history
    return {"prompt": prompt, **{key: example[key] for key in PAIR_KEYS}}


def _ids(encoded: Any) -> list[int]:
    if isinstance(encoded, dict) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    return [int(i) for i in encoded]


def render(tokenizer: Any, history: list[dict[str, str]], response: str) -> Document:
    """(ids, mask) of `history` + the assistant's `response`: only the response is a target."""
    from jinja2 import TemplateError

    conversation = [*history, {"role": "assistant", "content": response}]
    try:
        prompt = _ids(
            tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=True)
        )
        full = _ids(tokenizer.apply_chat_template(conversation, tokenize=True))
    except TemplateError as exc:  # the template's raise_exception(): a record it refuses
        raise PairError("chat_template_error", f"the chat template failed: {exc}") from None
    if full[: len(prompt)] != prompt:
        raise PairError(
            "answer_boundary",
            "the chat template's generation prompt is not a token prefix of the conversation",
        )
    return full, [0] * len(prompt) + [1] * (len(full) - len(prompt))


def pair_of(tokenizer: Any, history: list[dict[str, str]], chosen: str, rejected: str) -> Pair:
    """Both sides of a pair rendered (PairError when the template cannot render them, or when
    they are the same text: DPO's gradient for such a pair is exactly 0, it only dilutes the
    mean). Called on the cleaned texts, so responses that differ only in what cleaning removes
    count as the same."""
    if chosen == rejected:
        raise PairError("identical_responses", "chosen and rejected are the same text")
    return Pair(render(tokenizer, history, chosen), render(tokenizer, history, rejected))


def tokenize_pair(tokenizer: Any, record: dict[str, Any]) -> Pair:
    """A raw preference record, normalized and rendered (PairError when it cannot be)."""
    return pair_of(tokenizer, *normalize(record))


def pack_pairs(pairs: list[Pair], seq_len: int) -> list[list[Pair]]:
    """Rows of whole pairs: first-fit decreasing by length (ties in input order).

    The first row with room is found in a max-tree over the rows' free space (`_FreeSpace`), so
    packing a split costs O(pairs x log rows) rather than a scan of every row per pair (20k pairs
    took 5.6 s scanning).
    """
    order = sorted(range(len(pairs)), key=lambda i: (-len(pairs[i]), i))
    rows: list[list[Pair]] = []
    free = _FreeSpace(len(pairs))
    for i in order:
        need = len(pairs[i])
        if need > seq_len:
            raise ValueError(f"pair {i} has {need} tokens, more than seq_len={seq_len}")
        slot = free.first_with(need)
        if slot is None:
            rows.append([])
            slot = len(rows) - 1
            free.set(slot, seq_len)
        rows[slot].append(pairs[i])
        free.set(slot, free.room(slot) - need)
    return rows


class _FreeSpace:
    """Free tokens of up to `capacity` rows (0 for rows not opened) in a binary max-tree: the
    first row with at least n free is found in O(log rows)."""

    def __init__(self, capacity: int) -> None:
        self.leaves = 1
        while self.leaves < max(capacity, 1):
            self.leaves *= 2
        self.tree = [0] * (2 * self.leaves)

    def room(self, row: int) -> int:
        return self.tree[self.leaves + row]

    def set(self, row: int, room: int) -> None:
        node = self.leaves + row
        self.tree[node] = room
        while node > 1:
            node //= 2
            self.tree[node] = max(self.tree[2 * node], self.tree[2 * node + 1])

    def first_with(self, need: int) -> int | None:
        """The lowest row with room >= need (need >= 1), or None."""
        if self.tree[1] < need:
            return None
        node = 1
        while node < self.leaves:
            node = 2 * node if self.tree[2 * node] >= need else 2 * node + 1
        return node - self.leaves


def row_of(pairs: list[Pair], seq_len: int, pad_id: int) -> dict[str, list[int]]:
    """One packed row (the preference columns) holding `pairs`, padded to seq_len."""
    row: dict[str, list[int]] = {name: [] for name in row_columns(PREFERENCE_KIND)}
    for k, pair in enumerate(pairs):
        for side, (ids, mask) in enumerate((pair.chosen, pair.rejected)):
            row["input_ids"] += ids
            row["loss_mask"] += [0, *mask[1:]]  # the first token has no predecessor
            row["position_ids"] += list(range(len(ids)))
            row[PAIR_COLUMN] += [2 * k + 1 + side] * len(ids)
    free = seq_len - len(row["input_ids"])
    row["input_ids"] += [pad_id] * free
    row["loss_mask"] += [0] * free
    row["position_ids"] += list(range(free))
    row[PAIR_COLUMN] += [0] * free
    return row


def table_of(rows: list[dict[str, list[int]]]) -> Any:
    """Packed preference rows (`row_of`) as one pyarrow Table of the preference schema."""
    import pyarrow as pa

    schema = table_schema(PREFERENCE_KIND)
    return pa.table({c: [r[c] for r in rows] for c in schema.names}, schema=schema)


def split_stats(pairs: list[Pair], rows: list[dict[str, list[int]]]) -> tuple[int, int, int, int]:
    """(rows, documents, tokens, target tokens) of a split's packed pairs (SplitInfo's counts)."""
    targets = sum(sum(r["loss_mask"]) for r in rows)
    return len(rows), 2 * len(pairs), sum(len(p) for p in pairs), targets
