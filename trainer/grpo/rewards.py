"""Verifiable rewards for GRPO: the built-in rewards, their weighted sum, and the checks that stop
a run on a reward that raises or returns the wrong shape.

A reward function has TRL's signature (trl GRPOTrainer `reward_funcs`):

    def reward(completions: list[str], prompts: list[str], **columns) -> list[float]

one float per completion; `columns` holds the dataset's extra columns (e.g. `answer`), one value
per completion, exactly as the prompts dataset carries them (data_kind=prompts). The rewards of a
run are given by the `rewards` run parameter, a JSON list of built-ins with weights, e.g.

    [{"name": "exact_match", "column": "answer", "extract": "last_number", "weight": 1.0},
     {"name": "regex", "pattern": "^\\s*-?\\d+\\s*$", "weight": 0.2},
     {"name": "length_penalty", "max_chars": 40, "weight": 0.1}]

plus, optionally, a user module (trainer/grpo/reward_module.py). The total reward of a completion is
sum_k weight_k x reward_k (TRL's `reward_weights`, multi_objective_aggregation="sum_then_normalize").

JSON rather than a mini-language: a regex or a schema can hold any character, JSON quotes them
unambiguously, and the same string is valid in a KFP parameter, a YAML file and a shell.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RewardFn = Callable[..., Sequence[float]]

BUILTINS = ("exact_match", "regex", "json_schema", "length_penalty")
"""The built-in reward names (the `name` of an entry in the `rewards` parameter)."""

EXTRACTS = ("none", "last_number", "first_line")
"""How exact_match takes the answer out of a completion before comparing."""

_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*(?:\.\d+)?")


class RewardError(ValueError):
    """A reward function raised or returned the wrong shape: the message is one `error:` line
    naming the function and the record."""


@dataclass(frozen=True)
class Reward:
    """One reward function of a run and its weight."""

    name: str
    fn: RewardFn
    weight: float


def normalize(text: str) -> str:
    """Case-, space- and trailing-punctuation-insensitive form of an answer; numbers compare by
    value ("42.0" and "42" are equal, "1,000" is 1000)."""
    text = " ".join(str(text).strip().lower().split()).rstrip(".!?;:")
    number = text.replace(",", "")
    try:
        value = float(number)
    except ValueError:
        return text
    return repr(int(value)) if value.is_integer() else repr(value)


def extract(completion: str, how: str) -> str:
    """The answer part of a completion: all of it, its last number, or its first non-empty line."""
    if how == "last_number":
        numbers = _NUMBER.findall(completion)
        return numbers[-1] if numbers else ""
    if how == "first_line":
        return next((line for line in completion.splitlines() if line.strip()), "")
    return completion


def exact_match(column: str, how: str = "none") -> RewardFn:
    """1.0 where the normalised (extracted) completion equals the normalised `column` value, else 0."""

    def reward(completions: list[str], prompts: list[str], **columns: list[Any]) -> list[float]:
        if column not in columns:
            raise KeyError(f"the dataset has no column {column!r} (it has {sorted(columns)})")
        return [
            float(normalize(extract(c, how)) == normalize(str(answer)))
            for c, answer in zip(completions, columns[column], strict=True)
        ]

    return reward


def regex_reward(pattern: str, mode: str = "fullmatch") -> RewardFn:
    """1.0 where the completion (stripped) matches `pattern` in full (mode=fullmatch) or anywhere
    (mode=search), else 0: a format reward."""
    compiled = re.compile(pattern, re.DOTALL)
    match = compiled.fullmatch if mode == "fullmatch" else compiled.search

    def reward(completions: list[str], prompts: list[str], **columns: list[Any]) -> list[float]:
        return [float(match(c.strip()) is not None) for c in completions]

    return reward


def json_schema_reward(schema: Mapping[str, Any]) -> RewardFn:
    """1.0 where the completion parses as JSON (a ```json fence is allowed) and validates against
    `schema`, 0.5 where it parses but does not validate, 0 where it does not parse."""
    import jsonschema  # a core dependency; imported here so rewards without a schema need not load it

    validator = jsonschema.Draft202012Validator(schema)

    def reward(completions: list[str], prompts: list[str], **columns: list[Any]) -> list[float]:
        out = []
        for c in completions:
            text = c.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                out.append(0.0)
                continue
            out.append(1.0 if validator.is_valid(value) else 0.5)
        return out

    return reward


def length_penalty(max_chars: int) -> RewardFn:
    """0 up to `max_chars` characters, then -(excess / max_chars), floored at -1. Characters, not
    tokens: the reward sees text and is the same whichever tokenizer the model has."""

    def reward(completions: list[str], prompts: list[str], **columns: list[Any]) -> list[float]:
        return [-min(1.0, max(0, len(c) - max_chars) / max_chars) for c in completions]

    return reward


def parse_rewards(spec: str) -> list[Reward]:
    """The built-in rewards of a `rewards` parameter (a JSON list; "" is none). Raises ValueError
    with one sentence saying what to change."""
    if not spec.strip():
        return []
    try:
        entries = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise ValueError(f"rewards must be a JSON list of reward entries ({exc})") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError('rewards must be a JSON list of objects like {"name": "exact_match", ...}')
    return [_builtin(dict(entry), k) for k, entry in enumerate(entries)]


def _builtin(entry: dict[str, Any], k: int) -> Reward:
    name = entry.pop("name", None)
    weight = entry.pop("weight", 1.0)
    where = f"rewards[{k}] ({name})"
    if not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"{where}: weight must be a finite number (got {weight!r})")
    try:
        fn = _make(name, entry)
    except KeyError as exc:
        raise ValueError(f"{where}: missing key {exc}") from None
    except (TypeError, re.error, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    return Reward(f"{name}#{k}", fn, float(weight))


def _make(name: Any, args: dict[str, Any]) -> RewardFn:
    if name == "exact_match":
        how = args.pop("extract", "none")
        if how not in EXTRACTS:
            raise ValueError(f"extract must be one of {', '.join(EXTRACTS)} (got {how!r})")
        column = args.pop("column")
        _no_more(args)
        return exact_match(column, how)
    if name == "regex":
        mode = args.pop("mode", "fullmatch")
        if mode not in ("fullmatch", "search"):
            raise ValueError(f"mode must be fullmatch or search (got {mode!r})")
        pattern = args.pop("pattern")
        _no_more(args)
        return regex_reward(pattern, mode)
    if name == "json_schema":
        schema = args.pop("schema", {})
        _no_more(args)
        if not isinstance(schema, dict):
            raise ValueError("schema must be a JSON Schema object")
        return json_schema_reward(schema)
    if name == "length_penalty":
        max_chars = args.pop("max_chars")
        _no_more(args)
        if not isinstance(max_chars, int) or max_chars < 1:
            raise ValueError(f"max_chars must be a positive integer (got {max_chars!r})")
        return length_penalty(max_chars)
    raise ValueError(f"unknown reward {name!r}: use one of {', '.join(BUILTINS)} or reward_module")


def _no_more(args: dict[str, Any]) -> None:
    if args:
        raise ValueError(f"unknown keys {sorted(args)}")


def score(
    rewards: Sequence[Reward],
    completions: list[str],
    prompts: list[str],
    columns: Mapping[str, list[Any]],
    record_ids: Sequence[str] | None = None,
) -> list[list[float]]:
    """[completions][rewards] the value of each reward on each completion (TRL's rewards_per_func).

    A reward that raises or returns other than one finite number per completion raises RewardError
    naming the function and the record: on an exception the batch is re-run one completion at a
    time to find the first record that fails (a reward is a pure function of its inputs).
    """
    ids = list(record_ids) if record_ids is not None else [f"#{i}" for i in range(len(prompts))]
    table = [[0.0] * len(rewards) for _ in completions]
    for k, reward in enumerate(rewards):
        for i, value in enumerate(_call(reward, completions, prompts, columns, ids)):
            table[i][k] = value
    return table


def _call(
    reward: Reward,
    completions: list[str],
    prompts: list[str],
    columns: Mapping[str, list[Any]],
    ids: list[str],
) -> list[float]:
    try:
        values = reward.fn(completions=completions, prompts=prompts, **columns)
    except Exception as exc:  # a user's function may raise anything: named below
        _find_failing(reward, completions, prompts, columns, ids)
        # Every record alone passed: the batch as a whole failed.
        raise RewardError(
            f"reward {reward.name} raised {type(exc).__name__}: {exc} on the batch of records "
            f"{ids[0]}..{ids[-1]}"
        ) from exc
    if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
        raise RewardError(
            f"reward {reward.name} returned {type(values).__name__}, not a list of "
            f"{len(completions)} numbers (records {ids[0]}..{ids[-1]})"
        )
    if len(values) != len(completions):
        raise RewardError(
            f"reward {reward.name} returned {len(values)} values for {len(completions)} "
            f"completions (records {ids[0]}..{ids[-1]}): return one float per completion"
        )
    out = []
    for i, value in enumerate(values):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise RewardError(
                f"reward {reward.name} returned {value!r} for record {ids[i]}: "
                "return a finite float per completion"
            )
        out.append(float(value))
    return out


def _find_failing(
    reward: Reward,
    completions: list[str],
    prompts: list[str],
    columns: Mapping[str, list[Any]],
    ids: list[str],
) -> None:
    for i in range(len(completions)):
        one = {name: [values[i]] for name, values in columns.items()}
        try:
            reward.fn(completions=[completions[i]], prompts=[prompts[i]], **one)
        except Exception as exc:  # see _call
            raise RewardError(
                f"reward {reward.name} raised {type(exc).__name__}: {exc} on record {ids[i]} "
                f"(prompt {prompts[i][:60]!r})"
            ) from exc


def total(table: list[list[float]], rewards: Sequence[Reward]) -> list[float]:
    """[completions] the weighted sum of each completion's rewards."""
    return [sum(r.weight * v for r, v in zip(rewards, row, strict=True)) for row in table]
