"""The peak-memory estimate (trainer/memory_model.py): its constants against the real tensors they
stand for, and what it says about 7B models on one L4."""

from __future__ import annotations

import pytest
import torch

from trainer.memory_model import (
    LLAMA2_7B,
    LLAMA3_8B,
    ModelShape,
    estimate,
    fits,
    lora_params,
)
from trainer.quantize import nf4_bytes, to_nf4

L4_BYTES = 24e9
"""NVIDIA L4: 24 GB (the figure components/platform/platform_facts.py will hold)."""


def test_a_7b_qlora_run_fits_one_l4_and_lora_or_full_do_not() -> None:
    run = {"seq_len": 2048, "micro_batch_size": 1}
    qlora = estimate(LLAMA2_7B, method="qlora", **run)
    assert fits(qlora, L4_BYTES), qlora.as_gb()
    assert qlora.weights < 4.5e9  # 6.5B block weights at ~0.52 bytes, the rest in bf16
    assert not fits(estimate(LLAMA2_7B, method="lora", **run), L4_BYTES)
    assert not fits(estimate(LLAMA2_7B, method="full", **run), 80e9)
    # Llama 3 8B too, with activation checkpointing (its 128k vocabulary's logits are large).
    llama3 = estimate(LLAMA3_8B, method="qlora", activation_checkpointing=True, **run)
    assert fits(llama3, L4_BYTES), llama3.as_gb()
    # Sharding divides the full fine-tune's state; checkpointing shrinks activations.
    full_8 = estimate(LLAMA2_7B, method="full", world_size=8, **run)
    assert full_8.trainable == pytest.approx(12 * LLAMA2_7B.params / 8)
    assert estimate(LLAMA2_7B, method="qlora", activation_checkpointing=True, **run).activations < (
        qlora.activations / 5
    )


def test_nf4_bytes_is_what_torchao_stores() -> None:
    weight = torch.randn(1024, 4096)
    nf4 = to_nf4(weight, torch.bfloat16)
    inner = (nf4.quantized_data, nf4.quantized_scalers, nf4.quantization_factor)
    stored = sum(t.numel() * t.element_size() for t in inner)
    assert nf4_bytes(weight.numel()) == pytest.approx(stored, rel=0.01)


def test_lora_parameter_count_is_peft_s(tiny_model_dir) -> None:
    import json

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    # The block linears are what trainer/quantize.py quantizes: every block nn.Linear.
    linear = sum(
        m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)
    )
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=list(targets)))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    params = sum(p.numel() for p in model.parameters())
    shape = ModelShape.from_hf_config(config, params)
    assert lora_params(shape, 4, targets) == trainable
    assert shape.block_linear_params == linear


@pytest.mark.integration  # a fresh interpreter
def test_the_estimate_imports_no_torch() -> None:
    """Parameter checks can call it in a process that never loads torch."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, trainer.memory_model; assert 'torch' not in sys.modules, 'torch imported'"
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
