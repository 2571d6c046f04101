"""Record shapes: which fields of a raw record hold the text, and how they become an example.

No Beam here: `example_of(record, shape)` turns one raw record into an example (`{"messages":
[...]}` or `{"text": ...}`, see beam_preprocess.records) and names the fields it holds but did not
use, or raises `Invalid(reason, message)`. The Prepare step (beam_preprocess.record_steps) counts
them, so nothing is dropped without a number in stats.json.

| shape | fields (defaults) | example |
|---|---|---|
| auto | per record: `messages` (chat, or ShareGPT turns), `conversations` (ShareGPT), `instruction` + `output` without a prompt field (Alpaca), else `prompt` + `response` | as that shape |
| prompt_response | `prompt`, `response`, optional `system` | [system,] user, assistant |
| alpaca | `instruction`, optional `input`, `output`, optional `system` | user = instruction, then `\\n\\n### Input:\\n` + input when non-empty (the Alpaca template's layout) |
| chat | `messages`: `[{role, content}]` (OpenAI chat); tool turns per `tool_turns` | the turns |
| sharegpt | `conversations`: `[{from, value}]`, roles mapped by `SHAREGPT_ROLES` | the turns |
| text | `text` | plain text (data kind "text") |
| prompts | `prompt` (text or chat messages; `messages` when there is no `prompt`), optional `system`; every other field kept as a column (beam_preprocess/prompt_records.py) | the prompt's turns as `messages`, the rest as `columns` (data kind "prompts") |
| preference | per record: `prompt` + `chosen` + `rejected` strings, `prompt` turns + one-message `chosen`/`rejected` lists (TRL's conversational form), or `chosen`/`rejected` conversations sharing their history (beam_preprocess/pairs.py) | the history as `messages`, plus `chosen` and `rejected` texts (data kind "preference") |

Field names are parameters (`prompt_field`, ...); an empty one means the shape's default above
(the preference shape reads its fields by TRL's names).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any

from beam_preprocess import pairs, prompt_records
from beam_preprocess.records import has_lone_surrogate
from trainer.packed_data.format import PREFERENCE_KIND, PROMPTS_KIND

"""Shapes of instruction records (text data always reads one text field)."""
"""What becomes of a conversation with tool turns (a `tool`/`function` message, or an assistant
message with `tool_calls`/`function_call`): rejected (rejected/, counts towards
max_rejected_fraction) or filtered (filtered/, a policy), both with the reason `tool_turns`. They
are never trained on silently: chat templates render tool calls in incompatible ways."""
ROLES = ("system", "user", "assistant")
TOOL_ROLES = ("tool", "function", "ipython")
ALPACA_INPUT_FIELD = "input"
ALPACA_INPUT_HEADER = "\n\n### Input:\n"
"""Between an Alpaca instruction and its non-empty input, as the Alpaca prompt template lays
them out (tatsu-lab/stanford_alpaca `PROMPT_DICT["prompt_input"]`)."""
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "function_call": "tool",
    "observation": "tool",
    "tool": "tool",
}
"""ShareGPT `from` values -> chat roles; "tool" marks a tool turn (see TOOL_TURNS)."""

DEFAULT_FIELDS: dict[str, dict[str, str]] = {
    "auto": {"messages": "messages", "prompt": "prompt", "response": "response"},
    "prompt_response": {"prompt": "prompt", "response": "response"},
    "alpaca": {"prompt": "instruction", "response": "output"},
    "chat": {"messages": "messages"},
    "sharegpt": {"messages": "conversations"},
    "text": {"text": "text"},
    PREFERENCE_KIND: {},
    PROMPTS_KIND: {"prompt": "prompt", "messages": "messages"},
}
"""Each shape's default field names (the one place they are spelled); `system` is always
"system"."""
SYSTEM_FIELD = pairs.SYSTEM_FIELD


KIND_SHAPES = ("text", PREFERENCE_KIND, PROMPTS_KIND)
"""Data kinds whose records have one shape of their own (named after the kind), which the
record format does not choose."""


def shape_error(data_kind: str, record_format: str) -> str | None:
    """A record format other than auto means instruction data: it has no meaning for text or
    preference pairs."""
    if data_kind in KIND_SHAPES and record_format != "auto":
        return (
            f"record format {record_format!r} shapes instruction data, but the data kind is "
            f"{data_kind}: use the data kind instruction, or leave the record format auto"
        )
    return None


FIELD_NAMES = ("prompt", "response", "messages", "text", "system")
"""The field-name options (`prompt_field`, ...; an empty one: the shape's default)."""


def field_error(data_kind: str, given: list[str]) -> str | None:
    """Field names given for preference data, whose shape reads TRL's names (`given`: how the
    caller spells the options that were set)."""
    if data_kind != PREFERENCE_KIND or not given:
        return None
    return (
        f"{', '.join(given)}: not applicable to data kind preference (pairs are read as prompt, "
        "chosen, rejected; docs/preprocess.md)"
    )


class Invalid(Exception):
    """(reason, message) of a record that its shape cannot read; `kind` says where it goes:
    "rejected" (broken) or "filtered" (a policy, such as tool_turns=filter)."""

    def __init__(self, reason: str, message: str, kind: str = "rejected") -> None:
        super().__init__(reason, message)
        self.kind = kind


@dataclass(frozen=True)
class Shape:
    """A resolved record shape: the format and the actual field names (no empty ones)."""

    record_format: str = "auto"
    """One of RECORD_FORMATS, or the data kind for text and preference data (KIND_SHAPES)."""
    prompt: str = ""
    response: str = ""
    messages: str = ""
    text: str = ""
    system: str = SYSTEM_FIELD
    tool_turns: str = "reject"

    @classmethod
    def of(
        cls,
        data_kind: str,
        record_format: str = "auto",
        *,
        prompt: str = "",
        response: str = "",
        messages: str = "",
        text: str = "",
        system: str = "",
        tool_turns: str = "reject",
    ) -> Shape:
        """The shape with each empty field name replaced by the format's default."""
        fmt = data_kind if data_kind in KIND_SHAPES else record_format
        defaults = DEFAULT_FIELDS[fmt]
        given = {"prompt": prompt, "response": response, "messages": messages, "text": text}
        names = {k: v or defaults.get(k, "") for k, v in given.items()}
        return cls(fmt, system=system or SYSTEM_FIELD, tool_turns=tool_turns, **names)


def example_of(record: dict[str, Any], shape: Shape) -> tuple[dict[str, Any], list[str]]:
    """(example, the fields the record holds but the example was not made of: `unused_fields`,
    plus message keys besides role and content as `messages[].key`); raises
    Invalid(reason, message)."""
    example, used, nested = _example_of(record, shape)
    unused = unused_fields(record, used) if len(record) > len(used) else []
    return example, unused + nested


def _example_of(
    record: dict[str, Any], shape: Shape
) -> tuple[dict[str, Any], tuple[str, ...], list[str]]:
    if shape.record_format == "auto":
        shape = _detected(record, shape)
    fmt = shape.record_format
    if fmt == "text":
        return {"text": _required_text(record, shape.text)}, (shape.text,), []
    if fmt == PROMPTS_KIND:
        try:
            record_example, _ = prompt_records.example_of(
                record, shape.prompt, shape.messages, shape.system, shape.tool_turns
            )
        except prompt_records.PromptError as exc:
            raise Invalid(exc.reason, str(exc.args[1]), exc.kind) from None
        return record_example, tuple(record), []  # every other field is a column: none unused
    if fmt == PREFERENCE_KIND:
        try:
            pair, pair_fields = pairs.example_of(record)
        except pairs.PairError as exc:
            raise Invalid(exc.reason, str(exc)) from None
        return pair, pair_fields, []
    if fmt in ("chat", "sharegpt"):
        sharegpt = fmt == "sharegpt"
        messages, nested = _messages(record, shape.messages, sharegpt, shape.tool_turns)
        used = [shape.messages]
        system = _optional_text(record, shape.system)
        if shape.system in record:
            used.append(shape.system)  # read even when the conversation's own system turn wins
        if system is not None and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": system})
        return {"messages": messages}, tuple(used), nested
    prompt = _required_text(record, shape.prompt)
    response = _required_text(record, shape.response)
    used = [shape.prompt, shape.response]
    if fmt == "alpaca":
        extra = _optional_text(record, ALPACA_INPUT_FIELD)
        if ALPACA_INPUT_FIELD in record:
            used.append(ALPACA_INPUT_FIELD)
        if extra is not None:
            prompt = f"{prompt}{ALPACA_INPUT_HEADER}{extra}"
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    system = _optional_text(record, shape.system)
    if shape.system in record:
        used.append(shape.system)
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return {"messages": messages}, tuple(used), []


def _detected(record: dict[str, Any], shape: Shape) -> Shape:
    """The "auto" shape of one record: chat when it has the messages field (ShareGPT when its
    turns are {from, value}), ShareGPT when it has `conversations`, Alpaca when it has
    `instruction` and `output` but no prompt field, else prompt_response."""
    messages = record.get(shape.messages)
    if messages is not None:
        first = messages[0] if isinstance(messages, list) and messages else None
        sharegpt = isinstance(first, dict) and "from" in first and "role" not in first
        return _variant(shape, "sharegpt" if sharegpt else "chat", shape.messages)
    sharegpt_field = DEFAULT_FIELDS["sharegpt"]["messages"]
    if record.get(sharegpt_field) is not None:
        return _variant(shape, "sharegpt", sharegpt_field)
    alpaca = DEFAULT_FIELDS["alpaca"]
    if shape.prompt not in record and alpaca["prompt"] in record and alpaca["response"] in record:
        return _variant(shape, "alpaca", shape.messages)
    return _variant(shape, "prompt_response", shape.messages)


@functools.lru_cache(maxsize=64)
def _variant(shape: Shape, record_format: str, messages: str) -> Shape:
    """`shape` as `record_format` (with Alpaca's field names for alpaca), computed once per
    combination."""
    changes: dict[str, str] = {"record_format": record_format, "messages": messages}
    if record_format == "alpaca":
        changes |= DEFAULT_FIELDS["alpaca"]
    return dataclasses.replace(shape, **changes)


def unused_fields(record: dict[str, Any], used: tuple[str, ...]) -> list[str]:
    """Fields of `record` that hold a value (not null) but that the example was not made of."""
    return [k for k, v in record.items() if v is not None and k not in used]


def _present(record: dict[str, Any], name: str) -> bool:
    return record.get(name) is not None


def _required_text(record: dict[str, Any], name: str) -> str:
    if name not in record:
        raise Invalid("missing_field", f"field {name!r} is missing")
    if record[name] is None:
        raise Invalid("missing_field", f"field {name!r} is null")
    value = record[name]
    if not isinstance(value, str):
        raise Invalid("invalid_field_type", f"field {name!r} is {type(value).__name__}, not text")
    if not value.strip():
        raise Invalid("empty_field", f"field {name!r} is empty")
    return value


def _optional_text(record: dict[str, Any], name: str) -> str | None:
    """The field's text when it holds some; None when absent, null or blank."""
    value = record.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Invalid("invalid_field_type", f"field {name!r} is {type(value).__name__}, not text")
    return value if value.strip() else None


def _messages(
    record: dict[str, Any], name: str, sharegpt: bool, tool_turns: str
) -> tuple[list[dict[str, str]], list[str]]:
    """(the clean turns, `name[].key` for every other key a turn holds, such as a ShareGPT
    per-turn `weight`, which is not applied and so is reported)."""
    messages = record.get(name)
    if messages is None:
        raise Invalid("missing_field", f"field {name!r} is missing")
    if isinstance(messages, str):  # CSV cells and some exports hold the conversation as JSON text
        try:
            messages = json.loads(messages)
        except (ValueError, RecursionError) as exc:  # ValueError: also an int over 4,300 digits
            why = "nested too deeply" if isinstance(exc, RecursionError) else exc
            raise Invalid("invalid_messages", f"field {name!r} is not a JSON list: {why}") from None
        if has_lone_surrogate(messages):
            raise Invalid(
                "invalid_messages",
                f"field {name!r} holds an escaped lone UTF-16 surrogate (such as \\ud800), "
                "which is not text",
            )
    if not isinstance(messages, list) or not messages:
        raise Invalid("invalid_messages", f"field {name!r} must be a non-empty list of messages")
    clean = []
    known = _SHAREGPT_KEYS if sharegpt else _CHAT_KEYS
    extra: set[str] = set()
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise Invalid("invalid_messages", f"{name}[{i}] is not an object")
        role, content = _role_and_content(message, f"{name}[{i}]", sharegpt)
        if role in TOOL_ROLES or message.get("tool_calls") or message.get("function_call"):
            raise Invalid(
                "tool_turns",
                f"{name}[{i}] is a tool turn (role {role!r}); tool_turns={tool_turns}: "
                "remove tool turns from the data to train on these conversations",
                "filtered" if tool_turns == "filter" else "rejected",
            )
        if role not in ROLES:
            raise Invalid("invalid_messages", f"{name}[{i}].role {role!r} is not one of {ROLES}")
        if content is not None and not isinstance(content, str):
            raise Invalid(
                "invalid_field_type",
                f"{name}[{i}].content is {type(content).__name__}, not text",
            )
        if content is None or not content.strip():
            raise Invalid("empty_field", f"{name}[{i}].content is missing or empty")
        clean.append({"role": role, "content": content})
        if len(message) > 2:
            extra.update(k for k, v in message.items() if v is not None and k not in known)
    if clean[-1]["role"] != "assistant":
        raise Invalid("invalid_messages", f"the last message of {name!r} must be the assistant's")
    if not any(m["role"] == "user" for m in clean):
        raise Invalid("invalid_messages", f"{name!r} has no user message")
    return clean, [f"{name}[].{key}" for key in sorted(extra)]


_CHAT_KEYS = frozenset(("role", "content"))
_SHAREGPT_KEYS = frozenset(("from", "value"))


def _role_and_content(message: dict[str, Any], where: str, sharegpt: bool) -> tuple[Any, Any]:
    if not sharegpt:
        return message.get("role"), message.get("content")
    speaker = message.get("from")
    if not isinstance(speaker, str) or speaker not in SHAREGPT_ROLES:  # a list is unhashable
        raise Invalid(
            "invalid_messages",
            f"{where}.from {speaker!r} is not a ShareGPT speaker ({', '.join(SHAREGPT_ROLES)})",
        )
    return SHAREGPT_ROLES[speaker], message.get("value")
