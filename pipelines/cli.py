"""`llmft`: the command line. Every command's work lives in an importable module; this file only
parses flags and turns user errors (ValueError, FileNotFoundError) into a one-line message and
exit code 2, never a stack trace.

Heavy imports (torch, Beam, KFP, Google SDKs) happen inside each command so `llmft --help` is fast.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

app = typer.Typer(
    name="llmft",
    help="Fine-tune LLMs with Kubeflow Pipelines: locally, on Vertex AI, or on KFP on GKE.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(func: F) -> F:
    """Report user mistakes as `error: <message>` and exit 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, FileNotFoundError, PermissionError) as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def parse_params(pairs: list[str] | None) -> dict[str, Any]:
    """KEY=VALUE pairs; values are parsed as JSON when they parse (numbers, bools, lists)."""
    params: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {pair!r} is not KEY=VALUE")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


@app.command("sample-data")
@user_errors
def sample_data(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write train/heldout/dirty JSONL to.")],
    train: Annotated[int, typer.Option(help="Training records.")] = 4000,
    heldout: Annotated[int, typer.Option(help="Held-out records (prompts never in train).")] = 400,
    seed: Annotated[int, typer.Option(help="RNG seed; same seed, same bytes.")] = 0,
) -> None:
    """Write a deterministic instruction dataset (+ held-out, + dirty variant)."""
    from pipelines.quickstart.sample_data import write_sample_data

    _print_json(write_sample_data(out_dir, n_train=train, n_heldout=heldout, seed=seed))


@app.command("tiny-model")
@user_errors
def tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to save the model and tokenizer to.")],
    data: Annotated[Path | None, typer.Option(help="Sample data dir to train the tokenizer on.")] = None,
    vocab_size: Annotated[int, typer.Option(help="BPE vocabulary size.")] = 4096,
    hidden_size: Annotated[int, typer.Option(help="Model width.")] = 256,
    layers: Annotated[int, typer.Option(help="Decoder layers.")] = 4,
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
) -> None:
    """Build a tiny Llama + trained BPE tokenizer and save them with save_pretrained."""
    from pipelines.quickstart.tiny_model import build_tiny_model

    _print_json(
        build_tiny_model(
            out_dir, data_dir=data, vocab_size=vocab_size, hidden_size=hidden_size,
            num_layers=layers, seed=seed,
        )
    )


@app.command("compile")
@user_errors
def compile_cmd(
    target: Annotated[str, typer.Option(help="vertex (single document), kfp (with kfp-kubernetes) or all.")] = "all",
    output_dir: Annotated[Path, typer.Option(help="Where to write the YAML files.")] = Path("compiled"),
) -> None:
    """Compile the fine-tune pipeline (and, with --target all, every component) to YAML."""
    from pipelines.compile import compile_all

    for path in compile_all(target, output_dir):
        typer.echo(f"wrote {path}")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
