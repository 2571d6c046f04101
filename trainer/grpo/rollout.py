"""GRPO rollouts: G completions per prompt sampled from the current policy with transformers'
`generate` (KV cache on), and the per-token log-probabilities of those completions under the policy,
the sampling policy (old) and the reference (the base with LoRA adapters off, as for DPO).

    rollout = sample(model, tokenizer, prompts, Sampling(group_size=4, temperature=1.0, ...))
    logps = completion_logps(model, rollout, temperature)          # [N, T], differentiable

Prompts are rendered with the tokenizer's chat template when given as messages, left-padded so
every completion starts at the same column (one batched `generate` for all prompts x G). A
completion ends at its first EOS, which is kept as a target (the model learns to stop), as in TRL.
Log-probabilities divide the logits by the sampling temperature (TRL does the same), so the ratio
pi/pi_old compares the distributions the completions were drawn from.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn (TrainConfig's grpo_* fields)."""

    group_size: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    max_completion_tokens: int = 256


@dataclass
class Rollout:
    """N = prompts x G completions, grouped consecutively by prompt."""

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P]
    completion_ids: torch.Tensor  # [N, T] right-padded
    completion_mask: torch.Tensor  # [N, T] 1 up to and including the first EOS
    completions: list[str]
    prompts: list[str]  # the rendered prompt of each completion
    seconds: float  # generation wall time
    sampling_logps: torch.Tensor | None = None
    """[N, T] the sampled tokens' log-probs as the generating engine computed them (vLLM); None
    when the policy itself generated (transformers' generate)."""

    @property
    def completion_tokens(self) -> int:
        return int(self.completion_mask.sum())


def render(tokenizer: Any, prompt: str | list[dict[str, str]]) -> str:
    """The text a prompt is generated from: chat messages through the chat template (with the
    assistant turn opened), plain text as it is."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)


@torch.no_grad()
def sample(
    model: Any,
    tokenizer: Any,
    prompts: list[str | list[dict[str, str]]],
    sampling: Sampling,
    *,
    greedy: bool = False,
    synced_gpus: bool = False,
) -> Rollout:
    """G sampled completions per prompt (one greedy completion per prompt with greedy=True, for
    evaluation). `synced_gpus`: sharded weights (FSDP2 over several ranks), where every rank must
    run the same number of forward passes: generate keeps going until every rank is done."""
    texts = [render(tokenizer, p) for p in prompts]
    enc = left_padded(tokenizer, texts)
    device = next(model.parameters()).device
    n = 1 if greedy else sampling.group_size
    was_training = model.training
    model.eval()
    started = time.perf_counter()
    out = model.generate(
        input_ids=enc.input_ids.to(device),
        attention_mask=enc.attention_mask.to(device),
        do_sample=not greedy,
        temperature=sampling.temperature if not greedy else None,
        top_p=sampling.top_p if not greedy else None,
        top_k=0 if not greedy else None,
        max_new_tokens=sampling.max_completion_tokens,
        num_return_sequences=n,
        use_cache=True,
        pad_token_id=enc.pad_id,
        synced_gpus=synced_gpus,
    )
    seconds = time.perf_counter() - started
    model.train(was_training)
    prompt_len = enc.input_ids.size(1)
    completion_ids = out[:, prompt_len:]
    mask = until_eos(completion_ids, tokenizer.eos_token_id)
    completion_ids = completion_ids.masked_fill(mask == 0, enc.pad_id)
    decoded = tokenizer.batch_decode(completion_ids * mask, skip_special_tokens=True)
    return Rollout(
        prompt_ids=enc.input_ids.repeat_interleave(n, 0).to(device),
        prompt_mask=enc.attention_mask.repeat_interleave(n, 0).to(device),
        completion_ids=completion_ids,
        completion_mask=mask,
        completions=decoded,
        prompts=[t for t in texts for _ in range(n)],
        seconds=seconds,
    )


def left_padded(tokenizer: Any, texts: list[str]) -> Any:
    """The prompts' ids, left-padded (a tokenizer without a pad token pads with EOS, never
    attended: the tokenizer itself is left as it was, so the export keeps it)."""
    side, pad = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if pad is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc.pad_id = tokenizer.pad_token_id
    finally:
        tokenizer.padding_side = side
        if pad is None:
            tokenizer.pad_token = None
    return enc


def until_eos(ids: torch.Tensor, eos: int) -> torch.Tensor:
    """[N, T] 1 for the tokens up to and including the first EOS (all when there is none)."""
    is_eos = ids == eos
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), ids.size(1))
    return (torch.arange(ids.size(1), device=ids.device)[None, :] <= first[:, None]).long()


def completion_logps(
    model: Any, rollout: Rollout, temperature: float, rows: slice = slice(None)
) -> torch.Tensor:
    """[n, T] log-probabilities of the completion tokens of `rows` (differentiable when grad is on)."""
    prompt_ids, completion_ids = rollout.prompt_ids[rows], rollout.completion_ids[rows]
    ids = torch.cat([prompt_ids, completion_ids], 1)
    attention = torch.cat([rollout.prompt_mask[rows], rollout.completion_mask[rows]], 1)
    # Left padding: positions count real tokens only, as generate() numbered them.
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    logits = model(
        input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False
    ).logits
    t = completion_ids.size(1)
    logits = logits[:, -t - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


@contextlib.contextmanager
def adapters_off(model: Any) -> Iterator[None]:
    """The reference policy: a PEFT model with its adapters disabled (the base), as DPO's
    reference (trainer/model.py). A model without adapters has no reference: the caller must not
    ask for one (objective=grpo with beta > 0 requires lora_rank, checked in TrainConfig)."""
    disable = getattr(model, "disable_adapter", None)
    if disable is None:
        raise ValueError("a KL term (grpo_beta > 0) needs LoRA adapters: the reference is the base")
    with disable():
        yield
