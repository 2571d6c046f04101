"""Helpers every `llmft` command shares: the user-error policy (one `error:` line, exit code 2,
never a stack trace) and the small parsers of repeated KEY=VALUE flags."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from components.params.param_checks import redact_tokens
from trainer.config_args import load_config
from trainer.storage import DiskFullError

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(func: F) -> F:
    """Report user mistakes as `error: <message>` (tokens redacted) and exit 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except DiskFullError as exc:  # the machine, not the input: exit 1 (names the disk)
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(1) from None
        except (ValueError, FileNotFoundError, PermissionError) as exc:
            # Messages quote what was typed; a token typed by mistake must not be echoed.
            typer.secho(f"error: {redact_tokens(str(exc))}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def split_pairs(pairs: list[str] | None, flag: str) -> list[tuple[str, str]]:
    """Repeated `FLAG KEY=VALUE` values as (key, value); anything else is a user error."""
    split = []
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {pair!r} is not KEY=VALUE")
        split.append((key, value))
    return split


def parse_params(pairs: list[str] | None) -> dict[str, Any]:
    """KEY=VALUE pairs; values are parsed as JSON when they parse (numbers, bools, lists)."""
    params: dict[str, Any] = {}
    for key, value in split_pairs(pairs, "--param"):
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def parse_labels(pairs: list[str] | None) -> dict[str, str]:
    """`--label KEY=VALUE` pairs as a dict (values stay strings)."""
    return dict(split_pairs(pairs, "--label"))


def check_choice(value: str, allowed: tuple[str, ...], flag: str = "--backend") -> Any:
    """`value` if it is one of `allowed`, else a ValueError naming the flag and the choices."""
    if value not in allowed:
        raise ValueError(f"{flag} {value!r}: choose one of {', '.join(allowed)}")
    return value


def not_a_file(path: str | Path, flag: str) -> None:
    """Refuse an output directory that is an existing file (instead of a traceback later)."""
    if "://" not in str(path) and Path(path).is_file():
        raise ValueError(f"{flag} {str(path)!r} is a file: give a directory")


def print_json(data: Any) -> None:
    """Print a command's result for automation to read (stdout, indented JSON)."""
    typer.echo(json.dumps(data, indent=2, default=str))


def trainer_config(
    model: str,
    data: str,
    output: str,
    config: str | None,
    max_steps: int | None,
    set_: list[str] | None,
) -> Any:
    """The TrainConfig these flags describe, read by the trainer's own parser (so each flag means
    what it means to `python -m trainer`); every problem in one ValueError."""
    argv = ["--model", model, "--data", data, "--output", output]
    argv += ["--config", config] if config else []
    argv += ["--max-steps", str(max_steps)] if max_steps is not None else []
    for key, value in split_pairs(set_, "--set"):
        argv += [f"--{key}", value]
    return load_config(argv)
