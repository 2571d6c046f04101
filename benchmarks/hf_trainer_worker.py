"""The Hugging Face Trainer side of benchmarks/train_bench.py, run under torchrun by it.

    torchrun --standalone --nproc-per-node 2 benchmarks/hf_trainer_worker.py \
        --worker hf_padded|hf_packed --model M --data D --out O --steps N --micro-batch-size B

Each rank writes `<out>/rank<r>.json`: the end time of every optimizer step, the targets of
each step's batch, its peak RSS and HF's mean training loss (train_bench.hf_result reads them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def hf_worker(argv: list[str]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer

    a = _worker_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.config.use_cache = False
    dataset, batch_size, collator, sampling = _hf_dataset(a, tokenizer)
    clock = _step_clock()
    counting = _CountingCollator(collator)
    trainer = Trainer(
        model=model,
        args=_hf_training_args(a, batch_size, sampling),
        train_dataset=dataset,
        data_collator=counting,
        callbacks=[clock],
    )
    result = trainer.train()
    # The collator runs once per step, in step order (no worker processes): step k's batch is the
    # k-th (a look-ahead fetch may add one more at the end).
    steps = clock.steps  # type: ignore[attr-defined]
    for s, t in zip(steps[1:], counting.targets_per_step, strict=False):
        s["targets"] = t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    Path(a.out, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "steps": steps,
                "peak_rss_gb": peak,
                "final_loss": result.training_loss,
                "batch_size": batch_size,
            }
        )
    )


def _worker_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    for flag in ("--worker", "--model", "--data", "--out"):
        p.add_argument(flag)
    p.add_argument("--steps", type=int)
    p.add_argument("--micro-batch-size", type=int)
    p.add_argument("--group-by-length", action="store_true")
    return p.parse_args(argv)


def _hf_dataset(a: argparse.Namespace, tokenizer) -> tuple:
    """(dataset, per-device batch size, collator or None, sampling strategy) of a HF side."""
    import numpy as np
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq

    from trainer.packed_data.format import TRAIN_SPLIT, read_manifest
    from trainer.packed_data.reader import read_split

    manifest = read_manifest(a.data)
    train = manifest.splits["train"]
    docs_per_row = train.documents / train.rows
    if a.worker == "hf-packed":
        rows = read_split(a.data, manifest, TRAIN_SPLIT)
        ids = rows.input_ids.astype(np.int64)
        mask = rows.loss_mask
        pos = rows.position_ids.astype(np.int64)
        dataset = Dataset.from_dict(
            {"input_ids": ids, "position_ids": pos, "labels": np.where(mask == 1, ids, -100)}
        )
        return dataset, a.micro_batch_size, None, "random"
    from packed_fixtures import read_jsonl, tokenize_record

    sample = Path(a.data).parent / "sample" / "train.jsonl"
    encoded = [tokenize_record(tokenizer, r) for r in read_jsonl(sample)]
    dataset = Dataset.from_dict(
        {
            "input_ids": [ids for ids, _ in encoded],
            "labels": [
                [t if m else -100 for t, m in zip(ids, mask, strict=True)] for ids, mask in encoded
            ],
        }
    )
    # As many conversations per batch as one packed micro-batch holds: same work per step.
    batch_size = max(1, round(docs_per_row * a.micro_batch_size))
    collator = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100)
    # Random batches as in HF's instruction examples; --hf-group-by-length opts into
    # length-grouped batches (less padding).
    sampling = "group_by_length" if a.group_by_length else "random"
    return dataset, batch_size, collator, sampling


def _step_clock():
    """A TrainerCallback whose `steps` records the end of every optimizer step (and the start of
    training as step 0's end)."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict] = []

        def on_train_begin(self, args, state, control, **kw):
            self.steps.append({"step": 0, "end": time.perf_counter()})

        def on_step_end(self, args, state, control, **kw):
            self.steps.append({"step": state.global_step, "end": time.perf_counter()})

    return Clock()


class _CountingCollator:
    """Collates a batch (with `base`, or stacks packed rows) and records its target count."""

    def __init__(self, base) -> None:
        self.base = base
        self.targets_per_step: list[int] = []

    def __call__(self, features):
        import numpy as np
        import torch

        batch = (
            self.base(features)
            if self.base is not None
            else {k: torch.tensor(np.array([f[k] for f in features])) for k in features[0]}
        )
        self.targets_per_step.append(int((batch["labels"][:, 1:] != -100).sum()))
        return batch


def _hf_training_args(a: argparse.Namespace, batch_size: int, sampling: str):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=a.out,
        max_steps=a.steps,
        per_device_train_batch_size=batch_size,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        max_grad_norm=1.0,
        adam_beta2=0.95,
        weight_decay=0.0,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        train_sampling_strategy=sampling,
        dataloader_drop_last=True,
        remove_unused_columns=False,
        ddp_find_unused_parameters=False,
        disable_tqdm=True,
        seed=0,
    )


if __name__ == "__main__":
    hf_worker(sys.argv[1:])
