"""Prompt records (`data_kind` "prompts", objective grpo), no Beam: a record's prompt as chat
turns, and every other field kept unchanged as a column for the rewards.

| record | example |
|---|---|
| `prompt`: text, optional `system` | `{"messages": [[system,] user], "columns": {...}, "text_prompt": True}` |
| `prompt`: chat messages `[{role, content}]` (or `messages` when there is no `prompt`) | `{"messages": the turns, "columns": {...}}` |

`columns` holds every other field of the record, unchanged (e.g. `answer`, `tests`): it reaches
the reward functions as it was read. A text prompt stays text (rendered without a chat template,
as TRL does with a string prompt); its turn form serves cleaning, hashing and the split. The
prompt's last turn must be the user's (the completion is the assistant's answer to it).
"""

from __future__ import annotations

import json
from typing import Any

from trainer.packed_data.format import (
    MANIFEST_FILE,
    PROMPTS_KIND,
    Manifest,
    SplitInfo,
    TokenizerIdentity,
)
from trainer.packed_data.prompts import write_prompt_shard

ROLES = ("system", "user", "assistant")
TOOL_ROLES = ("tool", "function", "ipython")


class PromptError(Exception):
    """(reason, message) of a record that is not a prompt record; `kind` rejected or filtered."""

    def __init__(self, reason: str, message: str, kind: str = "rejected") -> None:
        super().__init__(reason, message)
        self.reason, self.kind = reason, kind


def example_of(
    record: dict[str, Any],
    prompt_field: str,
    messages_field: str,
    system_field: str,
    tool_turns: str,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(example, the fields the prompt was made of); raises PromptError."""
    name = prompt_field if record.get(prompt_field) is not None else messages_field
    prompt = record.get(name)
    if prompt is None:
        raise PromptError(
            "missing_field", f"field {prompt_field!r} (text or chat messages) is missing"
        )
    used = [name]
    system = record.get(system_field)
    if system_field in record:
        used.append(system_field)
    if system is not None and not isinstance(system, str):
        raise PromptError(
            "invalid_field_type", f"field {system_field!r} is {type(system).__name__}, not text"
        )
    text_prompt = isinstance(prompt, str)
    if text_prompt:
        if not prompt.strip():
            raise PromptError("empty_field", f"field {name!r} is empty")
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt:
        messages = _turns(prompt, name, tool_turns)
    else:
        raise PromptError(
            "invalid_field_type",
            f"field {name!r} must be text or a non-empty list of chat messages "
            f"(got {type(prompt).__name__})",
        )
    if system and system.strip() and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
        text_prompt = False  # a system turn needs the chat template
    columns = {k: v for k, v in record.items() if k not in used}
    try:
        json.dumps(columns, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PromptError("invalid_field_type", f"a column is not JSON data: {exc}") from None
    example: dict[str, Any] = {"messages": messages, "columns": columns}
    if text_prompt:
        example["text_prompt"] = True
    return example, tuple(used)


def _turns(prompt: list[Any], name: str, tool_turns: str) -> list[dict[str, str]]:
    turns = []
    for i, message in enumerate(prompt):
        if not isinstance(message, dict):
            raise PromptError("invalid_messages", f"{name}[{i}] is not an object")
        role, content = message.get("role"), message.get("content")
        if role in TOOL_ROLES or message.get("tool_calls") or message.get("function_call"):
            raise PromptError(
                "tool_turns",
                f"{name}[{i}] is a tool turn (role {role!r}); tool_turns={tool_turns}",
                "filtered" if tool_turns == "filter" else "rejected",
            )
        if role not in ROLES:
            raise PromptError(
                "invalid_messages", f"{name}[{i}].role {role!r} is not one of {ROLES}"
            )
        if not isinstance(content, str) or not content.strip():
            raise PromptError("empty_field", f"{name}[{i}].content is missing, empty or not text")
        turns.append({"role": role, "content": content})
    if turns[-1]["role"] != "user":
        raise PromptError(
            "invalid_messages",
            f"the last turn of {name!r} must be the user's (got {turns[-1]['role']})",
        )
    return turns


def is_prompt(example: dict[str, Any]) -> bool:
    """Whether an example (beam_preprocess.records) is a prompt record."""
    return "columns" in example


def record_of(example: dict[str, Any]) -> dict[str, Any]:
    """The example as the record the trainer and the rewards read: the prompt (text when it was
    text) and the columns unchanged."""
    messages = example["messages"]
    prompt: Any = messages[-1]["content"] if example.get("text_prompt") else messages
    return {**example["columns"], "prompt": prompt}


def hash_key(example: dict[str, Any]) -> list[dict[str, str]]:
    """What a prompt record's content hash covers: the turns, then the columns (a record is a
    duplicate only when its prompt and every column are equal)."""
    columns = json.dumps(example["columns"], sort_keys=True, ensure_ascii=False)
    return [*example["messages"], {"role": "columns", "content": columns}]


def prompt_tokens(tokenizer: Any, record: dict[str, Any]) -> int:
    """Tokens of the prompt as the rollout renders it (trainer/grpo/rollout.py `render`)."""
    prompt = record["prompt"]
    if not isinstance(prompt, str):
        prompt = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def write_dataset(
    out_dir: str, tokenizer: Any, records: dict[str, list[dict[str, Any]]], seq_len: int
) -> Any:
    """Write already clean and split prompt records ({split: [record]}) as a prompts dataset, in
    this process (tests, the packaged task): the rows the Beam graph writes for the same records
    in the same order, without its validation, deduplication and split. Returns the Manifest."""
    from pathlib import Path

    out = Path(out_dir)
    splits = {}
    for split, items in records.items():
        rows = [(r, prompt_tokens(tokenizer, r)) for r in items]
        too_long = [n for _, n in rows if n > seq_len]
        if too_long:
            raise ValueError(f"{len(too_long)} {split} prompts are longer than seq_len {seq_len}")
        (out / split).mkdir(parents=True, exist_ok=True)
        shard = f"{split}/part-00000.parquet"
        write_prompt_shard(str(out / shard), rows)
        tokens = sum(n for _, n in rows)
        splits[split] = SplitInfo(len(rows), len(rows), tokens, 0, [shard])
    kept = sum(len(v) for v in records.values())
    manifest = Manifest(
        seq_len=seq_len,
        tokenizer=TokenizerIdentity.of(tokenizer),
        data_kind=PROMPTS_KIND,
        splits=splits,
        stats={"records_read": kept, "kept": kept, "rejected": 0, "duplicates": 0, "filtered": {}},
    )
    (out / MANIFEST_FILE).write_text(manifest.to_json())
    return manifest
