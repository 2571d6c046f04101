"""Helpers for the evaluation tests: a packed dataset with eval records, and a brief fine-tune.

The dataset comes from tests/packed_fixtures.py (the same stand-in for `llmft preprocess` the
trainer tests use) plus the `eval_records/part-*.jsonl` file preprocessing writes for generation.
The fine-tune is a plain single-process AdamW loop over packed rows, called exactly the way the
trainer and the evaluator call the model (position_ids, no attention mask, use_cache=False), so the
evaluation tests do not depend on the distributed trainer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packed_fixtures import read_jsonl, write_packed_dataset


def build_eval_dataset(
    out_dir: Path, tokenizer: Any, sample_dir: Path, *, n_train: int, n_eval: int, seq_len: int
) -> Path:
    """Train split from train.jsonl, eval split (packed + eval_records) from heldout.jsonl."""
    train = read_jsonl(sample_dir / "train.jsonl", n_train)
    heldout = read_jsonl(sample_dir / "heldout.jsonl", n_eval)
    write_packed_dataset(out_dir, tokenizer, {"train": train, "eval": heldout}, seq_len)
    records = out_dir / "eval_records"
    records.mkdir(parents=True, exist_ok=True)
    (records / "part-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in heldout))
    return out_dir


def finetune_briefly(
    model_dir: Path,
    dataset_dir: Path,
    out_dir: Path,
    *,
    steps: int,
    batch_size: int = 8,
    lr: float = 2e-3,
    seed: int = 0,
) -> list[float]:
    """Fine-tune for `steps` AdamW steps; save model, tokenizer and metrics.jsonl; return losses."""
    with one_torch_thread():
        return _train(model_dir, dataset_dir, out_dir, steps, batch_size, lr, seed)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread inside: on a CPU shared with other test processes, more threads
    than free cores make every step wait on the slowest thread (measured 4-7x slower per step);
    tiny models gain nothing from more."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _train(
    model_dir: Path,
    dataset_dir: Path,
    out_dir: Path,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> list[float]:
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    table = pq.read_table(sorted((dataset_dir / "train").glob("*.parquet"))).to_pydict()
    input_ids = torch.tensor(table["input_ids"])
    position_ids = torch.tensor(table["position_ids"])
    labels = torch.where(torch.tensor(table["loss_mask"]).bool(), input_ids, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    losses, lines = [], []
    for step in range(1, steps + 1):
        idx = torch.randint(0, input_ids.shape[0], (batch_size,), generator=generator)
        out = model(
            input_ids=input_ids[idx],
            position_ids=position_ids[idx],
            labels=labels[idx],
            use_cache=False,
        )
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        lines.append(json.dumps({"step": step, "loss": losses[-1], "lr": lr}))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out_dir)
    (out_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return losses
