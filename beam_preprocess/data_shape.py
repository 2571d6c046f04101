"""The preprocessing settings a pipeline run sets: what kind of data it is and which fields of a
record hold it. Defined once, here, with no Beam import.

`DataShape`'s fields are at the same time
- `python -m beam_preprocess` / `llmft preprocess` flags (`--tool-turns`, ...: `add_arguments`),
- `PreprocessConfig` fields (it inherits them: beam_preprocess/options.py),
- run parameters of the fine-tune pipeline (`RunParams` inherits them too:
  components/params/run_params.py), with the same name, type, default and description; the
  pipeline's preprocess step passes each one on as its flag (`as_flags`).
So adding a data setting is one field below, its use, and a test (docs/architecture.md).

Each field's metadata holds its description (`help`); a `Literal` type gives its choices.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

from trainer.packed_data.format import PREFERENCE_KIND, PROMPTS_KIND

DataKind = Literal["instruction", "text", "preference", "prompts"]
DATA_KINDS: tuple[str, ...] = get_args(DataKind)
assert PREFERENCE_KIND in DATA_KINDS and PROMPTS_KIND in DATA_KINDS
RecordFormat = Literal["auto", "prompt_response", "alpaca", "chat", "sharegpt"]
RECORD_FORMATS: tuple[str, ...] = get_args(RecordFormat)
ToolTurns = Literal["reject", "filter"]
TOOL_TURNS: tuple[str, ...] = get_args(ToolTurns)


def setting(default: Any, help: str) -> Any:
    """A `DataShape` field: its one default and its description (console, `--help`, docs)."""
    return field(default=default, metadata={"help": " ".join(help.split())})


@dataclass(frozen=True)
class DataShape:
    """What the records are and where their text is."""

    data_kind: DataKind = setting(
        "instruction",
        '"instruction" for prompt/response or chat messages records, "text" for plain '
        'causal-LM text, "preference" for {prompt, chosen, rejected} pairs (objective dpo), "prompts" '
        "for records with a prompt (text or chat messages) and the columns the rewards read, kept "
        "unchanged (objective grpo; docs/grpo.md).",
    )
    record_format: RecordFormat = setting(
        "auto",
        'Shape of instruction records: "auto" (detected per record: messages, conversations, '
        "instruction+output, else prompt/response), "
        '"prompt_response", "alpaca" (instruction, optional input, output), "chat" (OpenAI '
        '[{role, content}]) or "sharegpt" (conversations of {from, value}); docs/preprocess.md.',
    )
    prompt_field: str = setting(
        "",
        'Field holding the prompt; empty: the format\'s default ("prompt", alpaca "instruction").',
    )
    response_field: str = setting(
        "",
        'Field holding the response; empty: the format\'s default ("response", alpaca "output").',
    )
    messages_field: str = setting(
        "",
        'Field holding a conversation; empty: the format\'s default ("messages", sharegpt '
        '"conversations").',
    )
    text_field: str = setting("", 'Field holding plain text (data_kind "text"); empty: "text".')
    system_field: str = setting(
        "", 'Field holding an optional system prompt, prepended as a system turn; empty: "system".'
    )
    tool_turns: ToolTurns = setting(
        "reject",
        'Conversations with tool calls or tool results: "reject" (counted in rejected/) or '
        '"filter" (counted in filtered/); they are never trained on.',
    )
    chat_template: str = setting(
        "",
        'Chat template replacing the tokenizer\'s own (needed for base models without one): "chatml", '
        '"alpaca", or a Jinja template string; empty uses the tokenizer\'s.',
    )
    bigquery_query: str = setting(
        "",
        "For train_data_uri bq://PROJECT.DATASET.TABLE: a SQL query naming the table as {table} "
        "(read at the run's snapshot time, recorded in the manifest); empty reads every row.",
    )

    train_data_mix: str = setting(
        "",
        "A weighted mix of training sources, sampled by tokens: SOURCE=WEIGHT,... (e.g. "
        '"train=0.7,gs://b/general/*.jsonl=0.3") or a JSON list of {uri, weight}; "train" is '
        "train_data_uri, which gets the weight the others leave to 1 when unnamed; empty: "
        "train_data_uri alone (docs/preprocess.md, Weighted mixes).",
    )


SETTINGS: tuple[str, ...] = tuple(f.name for f in fields(DataShape))
"""The data settings by name, in order."""


def flag(name: str) -> str:
    """A setting's command-line flag: `tool_turns` -> `--tool-turns`."""
    return "--" + name.replace("_", "-")


def choices(name: str) -> tuple[str, ...]:
    """A setting's allowed values (empty for free-form ones)."""
    hint = typing.get_type_hints(DataShape)[name]
    return get_args(hint) if typing.get_origin(hint) is Literal else ()


def add_arguments(add: Callable[..., None]) -> None:
    """One flag per setting, with its default, choices and description."""
    for f in fields(DataShape):
        options = {"choices": allowed} if (allowed := choices(f.name)) else {}
        add(flag(f.name), dest=f.name, default=f.default, help=f.metadata["help"], **options)


def as_flags(values: Any) -> list[str]:
    """The settings of `values` (any object with their attributes) as flags; empty strings are
    left out (the flag's default is empty too)."""
    return [f"{flag(name)}={value}" for name in SETTINGS if (value := getattr(values, name)) != ""]


def from_options(options: Any) -> dict[str, Any]:
    """The settings parsed by `add_arguments`, by name."""
    return {name: getattr(options, name) for name in SETTINGS}
