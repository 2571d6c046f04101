"""Benchmark: our Beam preprocessing vs the Hugging Face `datasets` recipe users would otherwise write.

Run: `.venv/bin/python benchmarks/preprocess_bench.py [--records 50000] [--scales 1 10] [--repeats 3]`

Both sides get the same generated instruction corpus (JSONL of prompt/response records, built from
`pipelines.quickstart.sample_data.generate_records`: each record bundles 1-36 tasks so documents
range from ~15 to ~500 tokens) and the same 8k byte-level BPE tokenizer with a chat template. Timed:

  ours  `beam_preprocess.run` (the local runner with the worker count it picks for the input
        size, or --ours-workers): read, validate, clean,
        dedup, split, chat-template + tokenize with loss masks, best-fit packing without splitting
        documents, Parquet shards + manifest.
  peer  `datasets`: load_dataset("json"), map(batched=True, num_proc=2) rendering the chat template
        and tokenizing, then run_clm.py's `group_texts` (concatenate and cut into seq_len blocks,
        splitting documents across rows, no loss masks) with map(batched=True, num_proc=2).

Each run is a fresh interpreter that imports the libraries of both sides first (transformers,
datasets, Beam), then times its side from loading the tokenizer to the last file written; the
sides alternate, `--repeats` times (medians reported). Tokens/s counts the non-padding tokens in
each side's output. Fill ratio = non-padding / all tokens. Peak memory is the largest process's
RSS (ours: the runner process or one of its workers). `--scales 1 10` adds a run at 10x the
records (the fixed cost must amortize). The last line printed is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import shutil
import statistics
import subprocess
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
    corpus: Path, tokenizer: Path, out: Path, seq_len: int, workers: int | None
) -> dict[str, Any]:
    from beam_preprocess.options import local_workers
    from beam_preprocess.pipeline import run

    start = time.perf_counter()
    manifest = run(
        [
            f"--input={corpus}",
            f"--output={out}",
            f"--tokenizer={tokenizer}",
            f"--seq-len={seq_len}",
            # Without a worker count: what `llmft preprocess` picks by itself for this input.
            *([f"--direct_num_workers={workers}"] if workers else []),
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
        "beam_workers": workers or local_workers(corpus.stat().st_size, os.cpu_count() or 1),
        "kept": manifest.stats["kept"],
        "filtered": manifest.stats["filtered"],
    }


def run_peer(
    corpus: Path, tokenizer_dir: Path, cache: Path, seq_len: int, workers: int
) -> dict[str, Any]:
    from datasets import load_dataset
    from transformers import AutoTokenizer

    start = time.perf_counter()  # from here on as ours: tokenizer load, read, work, write
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


def run_side(
    side: str,
    corpus: Path,
    tokenizer: Path,
    out: Path,
    seq_len: int,
    workers: int,
    ours_workers: int | None,
) -> dict:
    """One side in a fresh interpreter (no warm caches, its own peak memory); returns its result."""
    argv = [sys.executable, __file__, "--side", side, "--corpus", str(corpus)]
    argv += ["--tokenizer", str(tokenizer), "--out", str(out)]
    argv += ["--seq-len", str(seq_len), "--workers", str(workers)]
    if ours_workers:
        argv += ["--ours-workers", str(ours_workers)]
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def side_main(args: argparse.Namespace) -> None:
    """`--side ours|peer`: import the libraries (both sides alike), run once, print JSON."""
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    # Resolved before timing on both sides: transformers builds its lazy import structure on the
    # first attribute access (about 1 s).
    import datasets
    from transformers import AutoTokenizer  # noqa: F401

    import beam_preprocess.pipeline  # noqa: F401

    datasets.disable_progress_bars()
    if args.side == "peer":
        result = run_peer(args.corpus, args.tokenizer, args.out, args.seq_len, args.workers)
    else:
        result = run_ours(args.corpus, args.tokenizer, args.out, args.seq_len, args.ours_workers)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    result["peak_rss_mb"] = {"main": round(own), "largest_worker": round(workers)}
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument(
        "--scales", type=int, nargs="+", default=[1], help="Also run at N x --records (e.g. 1 10)."
    )
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2, help="The peer's num_proc.")
    parser.add_argument(
        "--ours-workers",
        type=int,
        default=None,
        help="Force our --direct_num_workers (default: what llmft picks for the input size).",
    )
    parser.add_argument("--repeats", type=int, default=3, help="Runs per side; medians reported.")
    parser.add_argument("--workdir", type=Path, default=None, help="Keep outputs here.")
    parser.add_argument("--side", choices=("ours", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if args.side:
        side_main(args)
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="preprocess-bench-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        tokenizer = build_tokenizer(work / "tokenizer")
        for scale in args.scales:
            records = args.records * scale
            corpus = work / f"corpus-{records}.jsonl"
            write_corpus(corpus, records)
            print(f"corpus: {records} records, {corpus.stat().st_size / 1e6:.1f} MB", flush=True)
            runs: dict[str, list[dict]] = {"peer": [], "ours": []}
            for repeat in range(args.repeats):
                for side in ("peer", "ours"):  # alternated, so drift in load hits both alike
                    out = work / f"{side}-{records}-{repeat}"
                    runs[side].append(
                        run_side(
                            side,
                            corpus,
                            tokenizer,
                            out,
                            args.seq_len,
                            args.workers,
                            args.ours_workers,
                        )
                    )
                    shutil.rmtree(out, ignore_errors=True)
                    print(f"  {side} run {repeat + 1}: {runs[side][-1]}", flush=True)
            results.append(summarize(records, runs, args))
            print(f"RESULT-{records} " + json.dumps(results[-1]), flush=True)
    result = results[0] if len(results) == 1 else {"scales": results}
    print("RESULT " + json.dumps(result))


def summarize(records: int, runs: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    """Medians over the repeats, and the ratio of the median throughputs."""
    median = {
        side: {
            "seconds": statistics.median(r["seconds"] for r in results),
            "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in results)),
            "peak_rss_mb": max(max(r["peak_rss_mb"].values()) for r in results),
        }
        for side, results in runs.items()
    }
    ratio = median["ours"]["tokens_per_s"] / median["peer"]["tokens_per_s"]
    print(
        f"{records} records: tokens/s ours {median['ours']['tokens_per_s']:,} vs peer "
        f"{median['peer']['tokens_per_s']:,} (medians of {args.repeats}): ratio {ratio:.2f}; "
        f"fill ours {runs['ours'][0]['fill_ratio']} (documents never split)"
    )
    return {
        "records": records,
        "seq_len": args.seq_len,
        "workers": args.workers,
        "repeats": args.repeats,
        "ratio": round(ratio, 3),
        "fill_ratio": runs["ours"][0]["fill_ratio"],
        "ours": median["ours"],
        "peer": median["peer"],
        "ratios_per_repeat": [
            round(o["tokens_per_s"] / p["tokens_per_s"], 3)
            for o, p in zip(runs["ours"], runs["peer"], strict=True)
        ],
    }


if __name__ == "__main__":
    main()
