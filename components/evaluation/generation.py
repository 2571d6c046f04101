"""Batched greedy generation for held-out prompts.

Prompts are rendered with the tokenizer's chat template (`add_generation_prompt=True`) and padded
on the left, so every row's last prompt token sits at the same position and new tokens are appended
right after it. Greedy decoding makes the evaluation deterministic (the same model gives the same
answers on every run, so before/after differences come from the weights). Generation stops at any
of the model's stop tokens (`stop_token_ids`: every eos id of its generation_config, e.g. a chat
model's end-of-turn token, plus the tokenizer's eos) or after `max_new_tokens`.

The prompt tokens are `prompt_token_ids`: the rendered prompt encoded on its own, exactly the
prompt tokens training saw (beam_preprocess.tokenize encodes prompt and answer apart whenever a
token would straddle them; tests/test_model_families.py checks the two agree).
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


def prompt_token_ids(tokenizer: Any, examples: Sequence[Example]) -> list[list[int]]:
    """The token ids generation starts from, one list per example (no padding)."""
    # The chat template already holds any BOS the model expects; adding special tokens again
    # would double it.
    encoded = tokenizer(render_prompts(tokenizer, examples), add_special_tokens=False)
    return [list(ids) for ids in encoded["input_ids"]]


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every token that ends an answer: the generation_config's eos ids, then the tokenizer's."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    candidates = list(configured) if isinstance(configured, list | tuple) else [configured]
    ids = [int(i) for i in [*candidates, tokenizer.eos_token_id] if i is not None]
    if not ids:
        raise ValueError(
            f"neither the model's generation_config nor tokenizer {tokenizer.name_or_path!r} names "
            "an EOS token to stop at: set eos_token_id in generation_config.json"
        )
    return list(dict.fromkeys(ids))


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
    stop = stop_token_ids(model, tokenizer)
    prompts = prompt_token_ids(tokenizer, examples)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
    answers: list[str] = []
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            width = max(len(ids) for ids in chunk)
            # Left padding: every row's last prompt token sits at the same position.
            input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in chunk])
            attention_mask = torch.tensor(
                [[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk]
            )
            output = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=stop,
                pad_token_id=pad_id,
            )
            answers.extend(
                text.strip()
                for text in tokenizer.batch_decode(output[:, width:], skip_special_tokens=True)
            )
    return answers
