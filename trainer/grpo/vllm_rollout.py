"""GRPO rollouts with vLLM in colocate mode (`grpo_use_vllm: true`): one vLLM engine inside each
training process, on its own GPU, generating that rank's prompts x G completions.

Built against vLLM's documented Python API the way TRL 1.16's `GRPOTrainer(use_vllm=True,
vllm_mode="colocate")` drives it (trl/generation/vllm_generation.py):

- the engine: `LLM(model=..., tensor_parallel_size=1, gpu_memory_utilization=...,
  distributed_executor_backend="external_launcher", seed=rank, logprobs_mode="processed_logprobs",
  enable_sleep_mode=...)`: "external_launcher" makes vLLM run inside the torchrun process (no
  workers of its own), each rank an engine of its own (tensor parallel size 1);
- before each rollout the policy's current weights go into the engine by name
  (`model_runner.model.load_weights`), LoRA merged into its base layer, FSDP2 shards gathered;
  then `reset_prefix_cache()`; with sleep mode the engine's weights and KV cache are released
  between rollouts (`sleep(level=2)`, `wake_up(tags=[...])`);
- `generate` on the prompts' token ids, each prompt repeated G times with `n=1` (as TRL), the
  sampled tokens' log-probabilities returned (`logprobs=0`) for the sampling correction
  (trainer/grpo/loss.py `sampling_correction`): the trainer scores the completions itself (old
  log-probs), and a completion vLLM drew far more likely than the policy would is left out.

vllm is not a dependency of this project (it pins its own CUDA torch): it must be in the training
image. Without it, or without a GPU, the trainer stops before anything starts with one `error:`
line (`unavailable`). This path has not been run (no vllm, no GPU where it was built): docs/grpo.md.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from typing import Any

import torch

from trainer.grpo.rollout import Rollout, Sampling, left_padded, render


def unavailable(device: torch.device) -> str | None:
    """Why this process cannot generate with vLLM (None when it can try)."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "grpo_use_vllm needs the vllm package, which is not installed here: add vllm (built "
            "for this torch and CUDA) to the training image, or set grpo_use_vllm=false to "
            "generate with transformers"
        )
    if device.type != "cuda":
        return (
            "grpo_use_vllm runs a vLLM engine on each rank's GPU and this rank has none: set "
            "grpo_use_vllm=false to generate with transformers"
        )
    return None


def engine_settings(config: Any, model_dir: str, rank: int, max_model_len: int) -> dict[str, Any]:
    """The keyword arguments of vLLM's `LLM(...)` for this rank (TRL's colocate mode's)."""
    return {
        "model": model_dir,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": config.grpo_vllm_gpu_memory_utilization,
        "max_model_len": max_model_len,
        "enable_sleep_mode": config.grpo_vllm_enable_sleep_mode,
        "distributed_executor_backend": "external_launcher",
        "seed": rank,  # each rank samples its own completions
        "max_num_batched_tokens": 4096,
        "logprobs_mode": "processed_logprobs",  # after temperature: what the policy is scored on
        "dtype": "bfloat16" if config.dtype in ("auto", "bf16") else "float32",
    }


def sampling_settings(sampling: Sampling) -> dict[str, Any]:
    """The keyword arguments of vLLM's `SamplingParams` for one completion per request."""
    return {
        "n": 1,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_completion_tokens,
        "logprobs": 0,  # the sampled token's own log-probability
    }


class VllmRollouts:
    """This rank's vLLM engine (see the module docstring)."""

    def __init__(self, config: Any, model_dir: str, rank: int, max_model_len: int) -> None:
        from vllm import LLM  # optional: only in images that ship vllm (checked by `unavailable`)

        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # torchrun's; vLLM reads them
            assert name in os.environ, f"{name} is unset: the trainer runs under torchrun"
        self.sleeps = config.grpo_vllm_enable_sleep_mode
        self.llm = LLM(**engine_settings(config, model_dir, rank, max_model_len))
        if self.sleeps:
            self.llm.sleep(level=2)

    def load_policy(self, lm: Any) -> None:
        """Collective under FSDP2: the policy's current weights into the engine."""
        if self.sleeps:
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        target = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        for name, tensor in policy_weights(lm):
            target.load_weights([(name, tensor)])
        self.llm.reset_prefix_cache()

    def sample(
        self, tokenizer: Any, prompts: list[Any], sampling: Sampling, device: torch.device
    ) -> Rollout:
        """G completions per prompt, as `rollout.sample` returns them."""
        from vllm import SamplingParams

        texts = [render(tokenizer, p) for p in prompts]
        enc = left_padded(tokenizer, texts)
        g = sampling.group_size
        ids = [
            row[mask.bool()].tolist()
            for row, mask in zip(enc.input_ids, enc.attention_mask, strict=True)
        ]
        requests = [{"prompt_token_ids": x} for x in ids for _ in range(g)]
        if self.sleeps:
            self.llm.wake_up(tags=["kv_cache"])
        started = time.perf_counter()
        outputs = self.llm.generate(
            requests, sampling_params=SamplingParams(**sampling_settings(sampling)), use_tqdm=False
        )
        seconds = time.perf_counter() - started
        if self.sleeps:
            self.llm.sleep(level=2)
        completions = [out.outputs[0] for out in outputs]
        tokens = [list(c.token_ids) for c in completions]
        logps = [
            [
                float(step[token].logprob)
                for step, token in zip(c.logprobs, c.token_ids, strict=True)
            ]
            for c in completions
        ]
        return padded_rollout(tokenizer, texts, enc, g, (tokens, logps), seconds, device)


def padded_rollout(
    tokenizer: Any,
    texts: list[str],
    enc: Any,
    group_size: int,
    completions: tuple[list[list[int]], list[list[float]]],
    seconds: float,
    device: torch.device,
) -> Rollout:
    """A Rollout from an engine's completions (token ids and their log-probs, G per prompt in
    prompt order) of the rendered prompts `texts`: prompts left-padded as `enc` holds them,
    completions right-padded, the mask each completion's own length (a completion that ended
    with EOS keeps it, as `rollout.sample`'s do)."""
    tokens, logps = completions
    t = max(1, max(len(x) for x in tokens))
    ids = torch.full((len(tokens), t), enc.pad_id, dtype=torch.long)
    mask = torch.zeros((len(tokens), t), dtype=torch.long)
    sampled = torch.zeros((len(tokens), t), dtype=torch.float32)
    for i, (row, row_logps) in enumerate(zip(tokens, logps, strict=True)):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
        sampled[i, : len(row)] = torch.tensor(row_logps, dtype=torch.float32)
    decoded = tokenizer.batch_decode(ids * mask, skip_special_tokens=True)
    return Rollout(
        prompt_ids=enc.input_ids.repeat_interleave(group_size, 0).to(device),
        prompt_mask=enc.attention_mask.repeat_interleave(group_size, 0).to(device),
        completion_ids=ids.to(device),
        completion_mask=mask.to(device),
        completions=decoded,
        prompts=[t for t in texts for _ in range(group_size)],
        seconds=seconds,
        sampling_logps=sampled.to(device),
    )


def policy_weights(lm: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights under the Hugging Face names vLLM's models load: each LoRA layer's
    base weight with its adapter merged (W + scaling x B A, computed here; the modules are left
    as they are), the adapters themselves not sent, FSDP2 shards gathered whole (a collective:
    every rank iterates alike). Tied weights come once (named_parameters), as vLLM expects."""
    merged = {
        f"{name}.base_layer.weight": module
        for name, module in lm.named_modules()
        if hasattr(module, "base_layer") and "default" in getattr(module, "lora_A", {})
    }
    for name, param in lm.named_parameters():
        if "lora_" in name or "original_module" in name:
            continue
        tensor = _whole(param.detach())
        if name in merged:
            module = merged[name]
            a = _whole(module.lora_A["default"].weight.detach())
            b = _whole(module.lora_B["default"].weight.detach())
            tensor = tensor + (b @ a).to(tensor.dtype) * module.scaling["default"]
        yield vllm_name(name), tensor


def vllm_name(name: str) -> str:
    """A parameter's name in the policy -> its Hugging Face checkpoint name."""
    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
    for wrapper in ("_checkpoint_wrapped_module.", "_orig_mod.", "modules_to_save.default."):
        name = name.replace(wrapper, "")
    return name


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    full = getattr(tensor, "full_tensor", None)  # an FSDP2 shard (DTensor)
    return full() if full is not None else tensor
