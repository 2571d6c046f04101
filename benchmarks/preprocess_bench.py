"""Benchmark: our Beam preprocessing vs the Hugging Face `datasets` recipe users would otherwise write.

Run: `.venv/bin/python benchmarks/preprocess_bench.py [--records 50000] [--scales 1 10] [--repeats 3]`

All sides get the same generated instruction corpus (JSONL of prompt/response records, built from
`pipelines.quickstart.sample_data.generate_records`: each record bundles 1-36 tasks so documents
range from ~15 to ~500 tokens) and the same 8k byte-level BPE tokenizer with a chat template. Timed:

  ours  `beam_preprocess.run` (the local runner with the worker count it picks for the input
        size, or --ours-workers): read, validate, clean,
        dedup, split, chat-template + tokenize with loss masks, best-fit packing without splitting
        documents, Parquet shards + manifest.
  peer  `datasets`: load_dataset("json"), map(batched=True, num_proc=2) rendering the chat template
        and tokenizing, then run_clm.py's `group_texts` (concatenate and cut into seq_len blocks,
        splitting documents across rows, no loss masks) with map(batched=True, num_proc=2).
  floor the tokenizer alone (about the least time rendering and tokenizing take; not a hard
        bound, as ours renders the template by a verified pattern, not Jinja): load the
        tokenizer, then `--workers` forked processes (the peer's num_proc) each read the JSONL,
        parse every `--workers`-th record, render the chat template (`apply_chat_template`, as
        the peer) and tokenize with the fast tokenizer's `encode_batch` in batches of 1000 (the
        peer's batch size), taking each encoding's ids; no cleaning, dedup, packing or writing.
        Processes rather than the tokenizers library's own threads alone: rendering the template
        is Python under the GIL, so one process would render on one core while the others wait;
        inside each process the tokenizer keeps its default threads, as in the peer's workers.

Each run is a fresh interpreter that imports the libraries of all sides first (transformers,
datasets, Beam), then times its side from loading the tokenizer to the last file written (the
floor: to the last batch tokenized, reading the JSONL included); the sides alternate (floor, peer,
ours), `--repeats` times (medians reported). Tokens/s counts the non-padding tokens in each
side's output (the floor: every token of the rendered corpus). Fill ratio = non-padding / all
tokens. Peak memory is the largest process's RSS (ours: the runner process or one of its
workers). `--scales 1 10` adds a run at 10x the records (the fixed cost must amortize).

Targets (issue 35), checked in RESULT: `ratio` (ours tokens/s over the peer's) >= 1.0 at every
scale, and memory flat: ours' peak RSS at the largest scale at most MEMORY_FLAT_BOUND x its peak at
the smallest (null with one scale: not measured). Per scale, `floor_tokens_per_s` and
`ours_over_floor` say how close ours comes to tokenizing alone. RESULT's `targets` holds one
boolean (or null) per target and `met` is true when every measured target holds; the summary
printed before it names any target that failed. The last line printed is `RESULT {json}`.
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

# Ours' peak RSS may grow at most this much from the smallest to the largest scale: the interpreter
# with its libraries and tokenizer (~640 MB) dominates a flat run, so 25% more means input-sized state.
MEMORY_FLAT_BOUND = 1.25
# Records per tokenizer batch on the floor side: datasets' default map() batch_size, as the peer.
FLOOR_BATCH = 1000
SIDES = ("floor", "peer", "ours")  # the order of each repeat


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


# The floor's tokenizer and corpus, set before its processes fork (they inherit them).
_FLOOR: dict[str, Any] = {}


def _floor_share(share: int) -> int:
    """One floor process: read the JSONL, keep every n-th record from `share`, render, tokenize."""
    tokenizer, corpus, n = _FLOOR["tokenizer"], _FLOOR["corpus"], _FLOOR["processes"]
    backend = tokenizer.backend_tokenizer
    tokens = 0

    def tokenize(records: list[dict]) -> int:
        conversations = [
            [
                {"role": "user", "content": r["prompt"]},
                {"role": "assistant", "content": r["response"]},
            ]
            for r in records
        ]
        texts = tokenizer.apply_chat_template(conversations, tokenize=False)
        return sum(len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False))

    batch: list[dict] = []
    with corpus.open() as f:
        for i, line in enumerate(f):
            if i % n == share:
                batch.append(json.loads(line))
                if len(batch) == FLOOR_BATCH:
                    tokens += tokenize(batch)
                    batch = []
    return tokens + (tokenize(batch) if batch else 0)


def run_floor(corpus: Path, tokenizer_dir: Path, workers: int) -> dict[str, Any]:
    import multiprocessing

    from transformers import AutoTokenizer

    start = time.perf_counter()  # as the others: from loading the tokenizer
    _FLOOR.update(
        tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir), corpus=corpus, processes=workers
    )
    pool = multiprocessing.get_context("fork").Pool(workers)
    tokens = sum(pool.map(_floor_share, range(workers)))
    seconds = time.perf_counter() - start
    pool.close()
    pool.join()  # reaped, so RUSAGE_CHILDREN holds their peak
    return {"seconds": round(seconds, 2), "tokens": tokens, "tokens_per_s": round(tokens / seconds)}


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
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"error: the {side} side exited {done.returncode}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def side_main(args: argparse.Namespace) -> None:
    """`--side floor|peer|ours`: import the libraries (all sides alike), run once, print JSON."""
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    # Resolved before timing on both sides: transformers builds its lazy import structure on the
    # first attribute access (about 1 s).
    import datasets
    from transformers import AutoTokenizer  # noqa: F401

    import beam_preprocess.pipeline  # noqa: F401

    datasets.disable_progress_bars()
    if args.side == "floor":
        result = run_floor(args.corpus, args.tokenizer, args.workers)
    elif args.side == "peer":
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
    parser.add_argument(
        "--workers", type=int, default=2, help="The peer's num_proc and the floor's processes."
    )
    parser.add_argument(
        "--ours-workers",
        type=int,
        default=None,
        help="Force our --direct_num_workers (default: what llmft picks for the input size).",
    )
    parser.add_argument("--repeats", type=int, default=3, help="Runs per side; medians reported.")
    parser.add_argument("--workdir", type=Path, default=None, help="Keep outputs here.")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
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
            runs: dict[str, list[dict]] = {side: [] for side in SIDES}
            for repeat in range(args.repeats):
                for side in SIDES:  # alternated, so drift in load hits all alike
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
    result.update(check_targets(results))
    print("RESULT " + json.dumps(result))


def summarize(records: int, runs: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    """Medians over the repeats, and the ratios of the median throughputs."""
    median = {
        side: {
            "seconds": statistics.median(r["seconds"] for r in results),
            "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in results)),
            "peak_rss_mb": max(max(r["peak_rss_mb"].values()) for r in results),
        }
        for side, results in runs.items()
    }
    ratio = median["ours"]["tokens_per_s"] / median["peer"]["tokens_per_s"]
    over_floor = median["ours"]["tokens_per_s"] / median["floor"]["tokens_per_s"]
    print(
        f"{records} records: tokens/s ours {median['ours']['tokens_per_s']:,} vs peer "
        f"{median['peer']['tokens_per_s']:,} (medians of {args.repeats}): ratio {ratio:.2f}; "
        f"tokenizer floor {median['floor']['tokens_per_s']:,}: ours at {over_floor:.2f} of it; "
        f"fill ours {runs['ours'][0]['fill_ratio']} (documents never split)"
    )
    return {
        "records": records,
        "seq_len": args.seq_len,
        "workers": args.workers,
        "repeats": args.repeats,
        "ratio": round(ratio, 3),
        "ratio_ge_1": ratio >= 1.0,  # unrounded: 0.9996 is a miss
        "floor_tokens_per_s": median["floor"]["tokens_per_s"],
        "ours_over_floor": round(over_floor, 3),
        "fill_ratio": runs["ours"][0]["fill_ratio"],
        "ours": median["ours"],
        "peer": median["peer"],
        "floor": median["floor"],
        "ratios_per_repeat": [
            round(o["tokens_per_s"] / p["tokens_per_s"], 3)
            for o, p in zip(runs["ours"], runs["peer"], strict=True)
        ],
        "ours_over_floor_per_repeat": [
            round(o["tokens_per_s"] / f["tokens_per_s"], 3)
            for o, f in zip(runs["ours"], runs["floor"], strict=True)
        ],
    }


def check_targets(results: list[dict]) -> dict:
    """Issue 35's targets over all scales; prints which failed. Returns RESULT's `targets`, `met`."""
    smallest = min(results, key=lambda r: r["records"])
    largest = max(results, key=lambda r: r["records"])
    growth = largest["ours"]["peak_rss_mb"] / smallest["ours"]["peak_rss_mb"]
    measured = len(results) > 1
    targets = {
        "ratio_ge_1_at_every_scale": all(r["ratio_ge_1"] for r in results),
        "memory_flat": growth <= MEMORY_FLAT_BOUND if measured else None,
    }
    met = all(v for v in targets.values() if v is not None)
    if not targets["ratio_ge_1_at_every_scale"]:
        misses = ", ".join(
            f"{r['records']} records: {r['ratio']}" for r in results if not r["ratio_ge_1"]
        )
        print(f"target FAILED: ours/peer tokens/s >= 1.0 at every scale ({misses})")
    if targets["memory_flat"] is False:
        print(
            f"target FAILED: memory flat: ours' peak {largest['ours']['peak_rss_mb']} MB at "
            f"{largest['records']} records is {growth:.2f}x its {smallest['ours']['peak_rss_mb']} "
            f"MB at {smallest['records']} (bound {MEMORY_FLAT_BOUND}x)"
        )
    if not measured:
        print("memory flat: not measured (one scale; run with --scales 1 10)")
    print(f"targets {'met' if met else 'NOT met'}: {targets}")
    return {
        "targets": targets,
        "memory_growth": round(growth, 3) if measured else None,
        "memory_flat_bound": MEMORY_FLAT_BOUND,
        "met": met,
    }


if __name__ == "__main__":
    main()
