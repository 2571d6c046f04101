"""Batched greedy generation for held-out prompts.

Prompts are rendered with the tokenizer's chat template (`add_generation_prompt=True`) and padded
on the left, so every row's last prompt token sits at the same position and new tokens are appended
right after it. Greedy decoding makes the evaluation deterministic (the same model gives the same
answers on every run, so before/after differences come from the weights). Generation stops at the
tokenizer's EOS token, which ends the assistant turn in chat templates, or after `max_new_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.evaluation.data import Example


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompts(tokenizer: Any, examples: Sequence[Example]) -> list[str]:
    if not has_chat_template(tokenizer):
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat template, so prompts cannot be "
            "rendered for generation: use a chat/instruct tokenizer or evaluate loss only "
            "(max_examples=0)"
        )
    return [
        tokenizer.apply_chat_template(ex.messages, tokenize=False, add_generation_prompt=True)
        for ex in examples
    ]


def generate_answers(
    model: Any,
    tokenizer: Any,
    examples: Sequence[Example],
    *,
    device: Any,
    batch_size: int = 16,
    max_new_tokens: int = 64,
) -> list[str]:
    """The model's greedy answer to each example, special tokens stripped, in input order."""
    import torch

    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError("generation batch_size and max_new_tokens must be >= 1")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no EOS token to stop at")
    prompts = render_prompts(tokenizer, examples)
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    previous_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    answers: list[str] = []
    try:
        with torch.inference_mode():
            for start in range(0, len(prompts), batch_size):
                # The chat template already holds any BOS the model expects; adding special
                # tokens again would double it.
                batch = tokenizer(
                    prompts[start : start + batch_size],
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=False,
                ).to(device)
                output = model.generate(
                    **batch,
                    do_sample=False,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=pad_id,
                )
                new_tokens = output[:, batch["input_ids"].shape[1] :]
                answers.extend(
                    text.strip()
                    for text in tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
                )
    finally:
        tokenizer.padding_side = previous_side
    return answers
