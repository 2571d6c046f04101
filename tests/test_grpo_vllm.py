"""grpo_use_vllm's parts that run without vllm (trainer/grpo/vllm_rollout.py; the engine itself has
not run: docs/grpo.md): the sampling correction and its loss against TRL 1.16's own code, the
weights handed to the engine, and an engine's token lists turned into the trainer's rollout.

Run: PYTHONPATH=$PWD pytest -q tests/test_grpo_vllm.py
"""

from __future__ import annotations

import inspect
import math
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_grpo import LOSS_TYPES, G, T, fixed_batch, tiny_lora, trl_compute_loss, trl_grpo

from trainer.grpo.loss import GrpoLoss, group_advantages, grpo_stats, sampling_correction

__all__ = ["tiny_lora"]  # the fixture, shared with tests/test_grpo.py


def trl_sampling_correction(batch: dict[str, torch.Tensor], sampling: torch.Tensor) -> torch.Tensor:
    """TRL's own vLLM importance-sampling block of _generate_and_score_completions (cut from its
    source, run as written) with GRPOConfig's defaults: sequence_mask, clip_max 3.0."""
    grpo_trainer, _ = trl_grpo()
    source = inspect.getsource(grpo_trainer._generate_and_score_completions)
    start = source.index("if self.use_vllm and self.vllm_importance_sampling_correction:")
    end = source.index("# Compute the per-token log probabilities for the reference model")
    block = textwrap.dedent(source[start:end])
    scope: dict[str, Any] = {
        "self": SimpleNamespace(
            use_vllm=True,
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode="sequence_mask",
            vllm_importance_sampling_clip_min=None,
            vllm_importance_sampling_clip_max=3.0,
        ),
        "completion_mask": batch["mask"],
        "tool_mask": None,
        "old_per_token_logps": batch["old"],
        "sampling_per_token_logps": sampling,
        "torch": torch,
        "math": math,
    }
    exec(block, scope)  # TRL's installed source: the reference under test
    return scope["vllm_importance_sampling_ratio"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_vllm_sampling_correction_equals_trl(loss_type: str) -> None:
    """Completions sampled by another engine (vLLM, grpo_use_vllm): the importance weights from
    its log-probs and the trainer's, and the loss and gradient weighted by them, equal TRL's
    (use_vllm=True, its default correction). Some completions are masked out (ratio > 3)."""
    batch = fixed_batch(seed=4)
    gen = torch.Generator().manual_seed(5)
    noise = (torch.rand(batch["old"].shape, generator=gen, dtype=torch.float64) - 0.5) * 0.2
    sampling = batch["old"] + noise
    sampling[:3] -= 0.7  # three completions vLLM found far likelier than the policy: ratio > 3
    weights = sampling_correction(batch["old"], sampling, batch["mask"].to(torch.float64))
    expected_weights = trl_sampling_correction(batch, sampling)
    assert torch.allclose(weights, expected_weights, atol=1e-10)
    assert (weights == 0).any() and (weights > 0).any()
    s = GrpoLoss(loss_type=loss_type, beta=0.04, max_completion_tokens=T)
    advantages = group_advantages(batch["rewards"], G)
    logps = batch["logps"].clone().requires_grad_(True)
    sums, units = grpo_stats(
        logps, batch["old"], advantages, batch["mask"], s, batch["ref"], weights
    )
    (sums[0] / units).backward()
    theirs = batch["logps"].clone().requires_grad_(True)
    expected = trl_compute_loss(theirs, batch, advantages, s, expected_weights)
    expected.backward()
    assert abs((sums[0] / units).item() - expected.item()) < 1e-4
    assert logps.grad is not None and theirs.grad is not None
    assert torch.allclose(logps.grad, theirs.grad, atol=1e-4, rtol=0)


def test_weights_for_vllm_are_the_merged_policy_under_checkpoint_names(tiny_lora) -> None:
    """What grpo_use_vllm loads into the engine before a rollout (trainer/grpo/vllm_rollout.py,
    run without vllm here): every weight of the base checkpoint by its own name, once, the LoRA
    layers' with the adapters merged: equal to peft's own merge."""
    import copy

    from safetensors.torch import load_file

    from trainer.grpo.vllm_rollout import policy_weights

    model, _ = tiny_lora
    model = copy.deepcopy(model)
    with torch.no_grad():  # adapters that change the weights (B starts at zero)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    sent = dict(policy_weights(model.get_base_model()))
    path = Path(model.base_model.model.config._name_or_path)
    checkpoint = load_file(path / "model.safetensors")
    assert set(sent) == set(checkpoint)
    merged = model.merge_and_unload().state_dict()
    for name, tensor in sent.items():
        assert torch.allclose(tensor, merged[name], atol=1e-6), name
    changed = [n for n in sent if not torch.allclose(sent[n], checkpoint[n].to(sent[n].dtype))]
    assert changed and all(("q_proj" in n or "v_proj" in n) for n in changed)


def test_an_engines_completions_become_the_rollout_generate_gives(tiny_lora) -> None:
    """`padded_rollout` (the vLLM path's conversion of token lists) rebuilds a transformers
    rollout from its completions' unpadded token ids: the same padding, masks and texts."""
    from trainer.grpo.rollout import Sampling, left_padded, render, sample
    from trainer.grpo.vllm_rollout import padded_rollout

    model, tokenizer = tiny_lora
    prompts = ["hi", [{"role": "user", "content": "Name a large country."}]]
    rollout = sample(model, tokenizer, prompts, Sampling(group_size=2, max_completion_tokens=6))
    mask = rollout.completion_mask.bool()
    tokens = [row[m].tolist() for row, m in zip(rollout.completion_ids, mask, strict=True)]
    logps = [[-1.0] * len(x) for x in tokens]
    texts = [render(tokenizer, p) for p in prompts]
    rebuilt = padded_rollout(
        tokenizer, texts, left_padded(tokenizer, texts), 2, (tokens, logps), 0.0,
        rollout.completion_ids.device,
    )  # fmt: skip
    width = rebuilt.completion_ids.size(1)
    assert torch.equal(rebuilt.prompt_ids, rollout.prompt_ids)
    assert torch.equal(rebuilt.prompt_mask, rollout.prompt_mask)
    assert torch.equal(rebuilt.completion_mask, rollout.completion_mask[:, :width])
    assert torch.equal(rebuilt.completion_ids * rebuilt.completion_mask,
                       (rollout.completion_ids * rollout.completion_mask)[:, :width])  # fmt: skip
    assert rebuilt.completions == rollout.completions and rebuilt.prompts == rollout.prompts
    assert rebuilt.sampling_logps is not None
    assert float((rebuilt.sampling_logps * rebuilt.completion_mask).sum()) == -sum(
        len(x) for x in tokens
    )
