"""Benchmark: preprocessing a two-source weighted mix vs one source of the same records (issue 48).

Run: `.venv/bin/python benchmarks/mix_bench.py [--scale 10] [--repeats 3]`

The data is the demo's (`llmft sample-data`: 4,000 training records) at `--scale` times its size:
`single` reads one JSONL of scale x 4,000 records; `mix` reads two JSONL files of half as many
records each (different seeds) as `--train-data-mix train=0.5,<second>=0.5`, so both sides
tokenize and pack about the same tokens. Both use the tiny quickstart tokenizer (4k BPE, the
demo's) and seq_len 512. Each run is a fresh interpreter timing `beam_preprocess.pipeline.run`
from the tokenizer's load to the manifest; sides alternate (single, mix) `--repeats` times and
medians are reported. Tokens/s counts the packed non-padding tokens (train + eval).

Target (issue 48): the mix's tokens/s at least 0.9 x the single source's, in the same run.
The last line printed is `RESULT {json}` with `ratio` (mix / single) and `met`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEMO_RECORDS = 4000
TARGET = 0.9


def write_jsonl(path: Path, records: int, seed: int) -> None:
    from pipelines.quickstart.sample_data import generate_records

    pool = list(generate_records(min(records, DEMO_RECORDS), seed=seed))
    with path.open("w") as f:
        for i in range(records):
            record = dict(pool[i % len(pool)])
            record["prompt"] = f"[{seed}:{i}] {record['prompt']}"  # unique, across files too
            f.write(json.dumps(record) + "\n")


def one_run(side: str, data: Path, tokenizer: Path, out: Path) -> dict[str, Any]:
    from beam_preprocess.pipeline import run

    argv = [
        f"--output={out}",
        f"--tokenizer={tokenizer}",
        "--seq-len=512",
        "--direct_num_workers=1",
    ]
    if side == "single":
        argv.append(f"--input={data / 'single.jsonl'}")
    else:
        argv += [
            f"--input={data / 'a.jsonl'}",
            f"--train-data-mix=train=0.5,{data / 'b.jsonl'}=0.5",
        ]
    start = time.perf_counter()
    manifest = run(argv)
    seconds = time.perf_counter() - start
    tokens = sum(s.tokens for s in manifest.splits.values())
    result = {
        "seconds": round(seconds, 2),
        "tokens": tokens,
        "tokens_per_s": round(tokens / seconds),
    }
    if "mix" in manifest.stats:
        result["shares"] = {k: v["share"] for k, v in manifest.stats["mix"]["sources"].items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--side", choices=("single", "mix"), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:  # one timed run in a fresh interpreter
        print(json.dumps(one_run(args.side, args.data, args.data / "tokenizer", args.out)))
        return
    from pipelines.quickstart.tiny_model import train_tokenizer

    work = Path(tempfile.mkdtemp(prefix="llmft-mix-bench-"))
    try:
        n = DEMO_RECORDS * args.scale
        write_jsonl(work / "a.jsonl", n // 2, seed=1)
        write_jsonl(work / "b.jsonl", n - n // 2, seed=2)
        with (work / "single.jsonl").open("w") as f:
            for name in ("a.jsonl", "b.jsonl"):
                f.write((work / name).read_text())
        train_tokenizer(None, vocab_size=4096).save_pretrained(work / "tokenizer")
        results: dict[str, list[dict[str, Any]]] = {"single": [], "mix": []}
        for repeat in range(args.repeats):
            for side in ("single", "mix"):
                out = work / f"out-{side}-{repeat}"
                done = subprocess.run(
                    [sys.executable, __file__, "--side", side, "--data", str(work), "--out", str(out)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                result = json.loads(done.stdout.strip().splitlines()[-1])
                results[side].append(result)
                print(side, result, flush=True)
                shutil.rmtree(out, ignore_errors=True)
        medians = {
            side: statistics.median(r["tokens_per_s"] for r in runs)
            for side, runs in results.items()
        }
        ratio = medians["mix"] / medians["single"]
        summary = {
            "records": n,
            "repeats": args.repeats,
            "single_tokens_per_s": medians["single"],
            "mix_tokens_per_s": medians["mix"],
            "ratio": round(ratio, 3),
            "target": TARGET,
            "met": ratio >= TARGET,
            "mix_shares": results["mix"][-1].get("shares"),
        }
        print("RESULT " + json.dumps(summary))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
