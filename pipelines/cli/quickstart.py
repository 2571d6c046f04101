"""`llmft sample-data`, `llmft sample-prompts` and `llmft tiny-model`: the demo's data and model
(pipelines/quickstart/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.common import print_json, user_errors

# lazy imports: each command imports the modules of its work in its body, so that `llmft --help`
# (0.4 s) does not pay for them: the three writers' modules take +13 ms to import (python -X
# importtime, quiet 2-core machine).


@user_errors
def sample_data(
    out_dir: Annotated[
        Path, typer.Argument(help="Directory to write train/heldout/dirty JSONL to.")
    ],
    train: Annotated[int, typer.Option(help="Training records.")] = 4000,
    heldout: Annotated[int, typer.Option(help="Held-out records (prompts never in train).")] = 400,
    seed: Annotated[int, typer.Option(help="RNG seed; same seed, same bytes.")] = 0,
) -> None:
    """Write a deterministic instruction dataset (+ held-out, + dirty variant)."""
    from pipelines.quickstart.sample_data import write_sample_data

    print_json(write_sample_data(out_dir, n_train=train, n_heldout=heldout, seed=seed))


@user_errors
def sample_prompts(
    out_dir: Annotated[
        Path, typer.Argument(help="Directory to write prompts.jsonl and rewards.json to.")
    ],
    n: Annotated[int, typer.Option(help="Prompt records.")] = 400,
    seed: Annotated[int, typer.Option(help="RNG seed; same seed, same bytes.")] = 0,
) -> None:
    """Write the packaged verifiable task for objective=grpo: arithmetic prompts with answers
    (data_kind prompts) and the rewards parameter that scores them."""
    from pipelines.quickstart.prompts_task import write_prompts_task

    if n < 1:
        raise ValueError(f"--n must be >= 1 (got {n})")
    print_json(write_prompts_task(out_dir, n=n, seed=seed))


@user_errors
def tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to save the model and tokenizer to.")],
    data: Annotated[
        Path | None, typer.Option(help="Sample data dir to train the tokenizer on.")
    ] = None,
    vocab_size: Annotated[int, typer.Option(help="BPE vocabulary size.")] = 4096,
    hidden_size: Annotated[int, typer.Option(help="Model width.")] = 256,
    layers: Annotated[int, typer.Option(help="Decoder layers.")] = 4,
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
) -> None:
    """Build a tiny Llama + trained BPE tokenizer and save them with save_pretrained."""
    from pipelines.quickstart.tiny_model import build_tiny_model

    if data is not None and not (data / "train.jsonl").is_file():
        raise ValueError(
            f"--data {str(data)!r} holds no train.jsonl (`llmft sample-data` writes one)"
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{str(out_dir)!r} is a file: give a directory to save the model to")
    print_json(
        build_tiny_model(
            out_dir,
            data_dir=data,
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_layers=layers,
            seed=seed,
        )
    )
