"""Benchmark: our Beam preprocessing vs the Hugging Face `datasets` recipe users would otherwise write.

Run: `.venv/bin/python benchmarks/preprocess_bench.py [--records 50000] [--seq-len 512]`

Both sides get the same generated instruction corpus (JSONL of prompt/response records, built from
`pipelines.quickstart.sample_data.generate_records`: each record bundles 1-36 tasks so documents
range from ~15 to ~500 tokens) and the same 8k byte-level BPE tokenizer with a chat template. Timed:

  ours  `beam_preprocess.run` (DirectRunner engine, 2 worker processes): read, validate, clean,
        dedup, split, chat-template + tokenize with loss masks, best-fit packing without splitting
        documents, Parquet shards + manifest.
  peer  `datasets`: load_dataset("json"), map(batched=True, num_proc=2) rendering the chat template
        and tokenizing, then run_clm.py's `group_texts` (concatenate and cut into seq_len blocks,
        splitting documents across rows, no loss masks) with map(batched=True, num_proc=2).

Tokens/s counts the non-padding tokens in each side's output. Fill ratio = non-padding / all tokens.
The last line printed is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
from itertools import chain
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write_corpus(path: Path, n_records: int, seed: int = 0) -> int:
    """Write `n_records` JSONL instruction records; returns the number written."""
    from pipelines.quickstart.sample_data import generate_records

    pool = [r for s in range(4) for r in generate_records(5000, seed=seed + s)]
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n_records):
            tasks = rng.sample(pool, rng.randint(1, 36))
            record = {
                "prompt": f"Task set {i}:\n" + "\n".join(t["prompt"] for t in tasks),
                "response": "\n".join(t["response"] for t in tasks),
            }
            f.write(json.dumps(record) + "\n")
    return n_records


def build_tokenizer(out_dir: Path) -> Path:
    """The 8k BPE tokenizer with the quickstart chat template (as tiny_model.train_tokenizer)."""
    from pipelines.quickstart.tiny_model import train_tokenizer

    train_tokenizer(None, vocab_size=8192).save_pretrained(out_dir)
    return out_dir


def run_ours(
    corpus: Path, tokenizer: Path, out: Path, seq_len: int, workers: int
) -> dict[str, Any]:
    from beam_preprocess.pipeline import run

    start = time.perf_counter()
    manifest = run(
        [
            f"--input={corpus}",
            f"--output={out}",
            f"--tokenizer={tokenizer}",
            f"--seq-len={seq_len}",
            f"--direct_num_workers={workers}",
            "--direct_running_mode=multi_processing",
        ]
    )
    seconds = time.perf_counter() - start
    rows = sum(s.rows for s in manifest.splits.values())
    tokens = sum(s.tokens for s in manifest.splits.values())
    return {
        "seconds": round(seconds, 2),
        "tokens": tokens,
        "rows": rows,
        "tokens_per_s": round(tokens / seconds),
        "fill_ratio": round(tokens / (rows * seq_len), 4),
        "kept": manifest.stats["kept"],
        "filtered": manifest.stats["filtered"],
    }


def run_peer(
    corpus: Path, tokenizer_dir: Path, cache: Path, seq_len: int, workers: int
) -> dict[str, Any]:
    from datasets import load_dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        conversations = [
            [{"role": "user", "content": p}, {"role": "assistant", "content": r}]
            for p, r in zip(batch["prompt"], batch["response"], strict=True)
        ]
        texts = tokenizer.apply_chat_template(conversations, tokenize=False)
        return tokenizer(texts, add_special_tokens=False)

    def group_texts(examples: dict[str, list]) -> dict[str, list]:
        # run_clm.py's group_texts, verbatim in substance.
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total_length = len(concatenated[next(iter(examples))])
        total_length = (total_length // seq_len) * seq_len
        result = {
            k: [t[i : i + seq_len] for i in range(0, total_length, seq_len)]
            for k, t in concatenated.items()
        }
        result["labels"] = result["input_ids"].copy()
        return result

    start = time.perf_counter()
    raw = load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))
    tokenized = raw.map(tokenize, batched=True, num_proc=workers, remove_columns=raw.column_names)
    grouped = tokenized.map(group_texts, batched=True, num_proc=workers)
    seconds = time.perf_counter() - start
    rows = grouped.num_rows
    tokens = rows * seq_len  # group_texts never pads (it drops each batch's remainder)
    source_tokens = sum(len(x) for x in tokenized["input_ids"])
    return {
        "seconds": round(seconds, 2),
        "tokens": tokens,
        "rows": rows,
        "tokens_per_s": round(tokens / seconds),
        "fill_ratio": 1.0,
        "tokens_dropped_by_group_texts": source_tokens - tokens,
        "splits_documents": True,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="Keep outputs here.")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    import datasets

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="preprocess-bench-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        corpus = work / "corpus.jsonl"
        write_corpus(corpus, args.records)
        tokenizer = build_tokenizer(work / "tokenizer")
        print(f"corpus: {args.records} records, {corpus.stat().st_size / 1e6:.1f} MB", flush=True)
        peer = run_peer(corpus, tokenizer, work / "hf_cache", args.seq_len, args.workers)
        print(f"peer (datasets map + group_texts): {peer}", flush=True)
        ours = run_ours(corpus, tokenizer, work / "packed", args.seq_len, args.workers)
        print(f"ours (beam_preprocess):            {ours}", flush=True)
    ratio = ours["tokens_per_s"] / peer["tokens_per_s"]
    print(
        f"tokens/s ours {ours['tokens_per_s']:,} vs peer {peer['tokens_per_s']:,}: ratio {ratio:.2f}"
    )
    print(
        f"fill ratio ours {ours['fill_ratio']} (documents never split), peer {peer['fill_ratio']}"
    )
    result = {
        "records": args.records,
        "seq_len": args.seq_len,
        "workers": args.workers,
        "ratio": round(ratio, 3),
        "fill_ratio": ours["fill_ratio"],
        "ours_tokens_per_s": ours["tokens_per_s"],
        "peer_tokens_per_s": peer["tokens_per_s"],
        "ours": ours,
        "peer": peer,
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
