"""Tokens/s of the trainer with and without MLflow tracking (issue 49: within 2%).

Run from a checkout with the server venv of tests/mlflow_server.py (built on first use):

    PYTHONPATH=. .venv/bin/python benchmarks/tracking_bench.py [--pairs 5] [--steps 40]

The same ~7M Llama and packed data as benchmarks/train_bench.py, `torchrun --nproc-per-node 2`
on CPU, every step logged (`--log-every 1`: the worst case for tracking). Each pair runs the
trainer once without tracking ("off") and once logging every step to a real `mlflow server` on
loopback ("on", sqlite store), in an order that alternates between pairs (the machine may be
shared: load drifts). Throughput is train_bench's steady-state target tokens/s (warm-up steps
excluded); the ratio on/off is taken within a pair, and the medians over pairs are printed. The
last line is `RESULT {json}`. The server runs on the same machine as the trainer, so "on" also
pays for the server's CPU: a fair upper bound on tracking's cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

MAX_SLOWDOWN = 0.02


def main() -> None:
    from mlflow.tracking import MlflowClient
    from mlflow_server import running_server
    from train_bench import prepare, run_ours

    args = _parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="llmft-tracking-bench-"))
    model, data = prepare(work, args.seq_len, args.records)
    pairs = []
    with running_server(work / "mlflow") as server:
        client = MlflowClient(tracking_uri=server.uri)
        experiment = client.create_experiment("tracking-bench")
        for pair in range(args.pairs):
            result = {}
            for side in ("off", "on") if pair % 2 == 0 else ("on", "off"):
                flags = args.trainer_flags
                if side == "on":
                    run = client.create_run(experiment, run_name=f"pair-{pair}").info.run_id
                    flags += f" --tracking-uri {server.uri} --tracking-run-id {run}"
                out = work / f"pair{pair}-{side}"
                result[side] = run_ours(
                    model, data, out, argparse.Namespace(**{**vars(args), "trainer_flags": flags}),
                    None,
                )  # fmt: skip
                if side == "on":
                    logged = client.get_metric_history(run, "loss")
                    assert len(logged) == args.steps, "every step's loss reached the server"
                    assert not (out / "mlflow-spool.jsonl").exists()
            ratio = result["on"]["target_tokens_per_s"] / result["off"]["target_tokens_per_s"]
            pairs.append({**result, "ratio_on_vs_off": ratio})
            print(f"pair {pair}: on/off = {ratio:.4f}", flush=True)
    summary = {
        "pairs": len(pairs),
        "steady_steps": args.steps - args.warmup_steps,
        "median_off_target_tokens_per_s": statistics.median(
            p["off"]["target_tokens_per_s"] for p in pairs
        ),
        "median_on_target_tokens_per_s": statistics.median(
            p["on"]["target_tokens_per_s"] for p in pairs
        ),
        "median_ratio_on_vs_off": statistics.median(p["ratio_on_vs_off"] for p in pairs),
        "ratios": [p["ratio_on_vs_off"] for p in pairs],
        "load_average_1m": [
            (p["off"]["load_average_1m_at_start"], p["on"]["load_average_1m_at_start"])
            for p in pairs
        ],
    }
    summary["within_2_percent"] = summary["median_ratio_on_vs_off"] >= 1 - MAX_SLOWDOWN
    print("RESULT " + json.dumps(summary))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="medians over this many pairs")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    parser.add_argument("--warmup-steps", type=int, default=10, help="excluded on both sides")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--trainer-flags", default="", help="extra `python -m trainer` flags")
    parser.add_argument("--workdir", default=None, help="keep files here (default: a temp dir)")
    return parser.parse_args()


if __name__ == "__main__":
    main()
