"""QLoRA (`quantize_base: nf4`, trainer/quantize.py) on CPU: the NF4 model's loss equals LoRA on
the de-quantized weights, the trainer runs it (DDP on one process, FSDP2 on two), resume is exact,
and the exported merged model is the model that trained (its loss is the run's eval loss)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from packed_fixtures import read_jsonl, write_packed_dataset
from test_trainer_single import run_trainer

from trainer.config import TrainConfig
from trainer.quantize import frozen_linears, is_nf4, nf4_round_trip, quantize_blocks

REPO = Path(__file__).resolve().parents[1]
QLORA = ("--lora-rank", "8", "--quantize-base", "nf4", "--lr", "1e-3")


@pytest.fixture(scope="module")
def packed_dir(tmp_path_factory, tiny_model_dir: Path, sample_data_dir: Path) -> Path:
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("packed_qlora")
    records = read_jsonl(sample_data_dir / "train.jsonl", 120)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    write_packed_dataset(out, tokenizer, {"train": records, "eval": records[:20]}, seq_len=128)
    return out


def lora_root(model_dir: Path) -> Any:
    """The trainer's loss module over the tiny model with LoRA on every attention and MLP
    projection, random B matrices (so the adapters matter), document attention."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer import attention
    from trainer.model import CausalLMLoss

    implementation = attention.implementation("document", AutoConfig.from_pretrained(model_dir))
    base = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=implementation
    )
    torch.manual_seed(0)
    targets = ["q_proj", "v_proj", "gate_proj"]  # o/k/up/down stay plain frozen linears
    lm = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    return CausalLMLoss(lm)


def test_nf4_loss_equals_lora_on_the_dequantized_weights(
    tiny_model_dir: Path, packed_dir: Path
) -> None:
    from trainer.data import eval_batches
    from trainer.model import decoder_blocks
    from trainer.packed_data.format import read_manifest

    batch = eval_batches(
        str(packed_dir), read_manifest(str(packed_dir)), rank=0, world_size=1, micro_batch_size=4
    )[0]
    inputs = (batch.input_ids, batch.position_ids, batch.loss_mask)
    layers = 4
    qlora = lora_root(tiny_model_dir)
    blocks = decoder_blocks(qlora, layers)
    linears = frozen_linears(blocks)
    assert len(linears) == layers * 7  # 3 LoRA base layers + 4 untargeted per block
    names = quantize_blocks(qlora, blocks, torch.float32)
    assert len(names) == len(linears) and all(is_nf4(m.weight) for _, m in linears)
    assert all(not p.requires_grad for n, p in qlora.named_parameters() if n in names)

    reference = lora_root(tiny_model_dir)  # same adapters (same seed), full-precision base
    full_precision = reference(*inputs)
    with torch.no_grad():
        state = reference.state_dict()
        for name in names:
            state[name].copy_(nf4_round_trip(state[name], torch.float32))
    quantized = qlora(*inputs)
    assert float(quantized) == pytest.approx(float(reference(*inputs)), rel=1e-6)
    assert abs(float(quantized) - float(full_precision)) > 1e-3  # NF4 did change the weights
    # Gradients reach the adapters only, through the 4-bit matmuls.
    quantized.backward()
    grads = {n for n, p in qlora.named_parameters() if p.grad is not None}
    assert grads and all("lora_" in n for n in grads)


def test_the_nf4_base_loads_in_the_compute_dtype_and_equals_an_fp32_load(
    tiny_model_dir: Path,
) -> None:
    """Host memory: an NF4 base is read in the compute dtype (bf16 on GPU: half an fp32 copy),
    for training and for the export's de-quantized base, and both are exactly what they were
    from an fp32 load (NF4 is built from the weights rounded to the compute dtype either way)."""
    from trainer.export import dequantized_base
    from trainer.model import CausalLMLoss, load_full_state_dict

    bf16 = torch.bfloat16
    config = TrainConfig(
        model=str(tiny_model_dir), data="d", output="o", lora_rank=8, quantize_base="nf4"
    )
    fp32_load = load_full_state_dict(config, str(tiny_model_dir))
    bf16_load = load_full_state_dict(config, str(tiny_model_dir), bf16)
    assert fp32_load.keys() == bf16_load.keys()
    for key, value in bf16_load.items():
        lora = "lora_" in key
        assert value.dtype == (torch.float32 if lora else bf16), key  # adapters stay fp32
        if not lora:
            assert torch.equal(value, fp32_load[key].to(bf16)), key
            if value.dim() == 2 and "embed" not in key:
                assert torch.equal(
                    nf4_round_trip(value, bf16), nf4_round_trip(fp32_load[key], bf16)
                ), key

    root = CausalLMLoss(torch.nn.Module())  # the export reads only where the base came from
    root.base_source = (config, str(tiny_model_dir), bf16)
    root.quantized = [k for k in fp32_load if k.endswith("proj.weight") and "lora_" not in k]
    assert root.quantized
    rebuilt = dequantized_base(root)
    for key, value in fp32_load.items():
        expected = nf4_round_trip(value, bf16) if key in root.quantized else value.to(bf16)
        assert rebuilt[key].dtype == bf16 and torch.equal(rebuilt[key], expected), key


def losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.mark.slow
def test_qlora_trains_resumes_exactly_and_exports_the_trained_model(
    tmp_path: Path, tiny_model_dir: Path, packed_dir: Path
) -> None:
    full = tmp_path / "full"
    steps = ("--max-steps", "4", "--checkpoint-every", "2", "--keep-checkpoints", "5")
    proc = run_trainer(tiny_model_dir, packed_dir, full, *QLORA, *steps)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = losses(full)
    assert sorted(first) == [1, 2, 3, 4] and first[4] < first[1]
    # Checkpoints hold what trains (adapters, their AdamW state), not the 4-bit base.
    step2 = full / "checkpoints/step-00000002"
    assert (step2 / "COMPLETE").exists()

    resumed = tmp_path / "resumed"
    shutil.copytree(step2, resumed / "checkpoints/step-00000002")
    proc = run_trainer(tiny_model_dir, packed_dir, resumed, *QLORA, *steps)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = losses(resumed)
    assert sorted(again) == [3, 4]
    for step in (3, 4):
        assert again[step] == pytest.approx(first[step], abs=1e-6)

    # The merged export is the model that trained: scored the trainer's way, its eval loss is
    # the run's (the de-quantized base plus the adapters, rebuilt on rank 0).
    summary = json.loads((full / "summary.json").read_text())
    assert (full / "model/adapter/adapter_config.json").exists()
    assert exported_eval_loss(full / "model", packed_dir) == pytest.approx(
        summary["eval_loss"], rel=1e-5
    )


def exported_eval_loss(model_dir: Path, packed_dir: Path) -> float:
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer import attention
    from trainer.data import eval_batches
    from trainer.model import CausalLMLoss
    from trainer.packed_data.format import read_manifest

    implementation = attention.implementation("document", AutoConfig.from_pretrained(model_dir))
    root = CausalLMLoss(
        AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation=implementation
        )
    ).eval()
    manifest = read_manifest(str(packed_dir))
    total = targets = 0.0
    with torch.no_grad():
        for mb in eval_batches(str(packed_dir), manifest, rank=0, world_size=1, micro_batch_size=2):
            total += float(root(mb.input_ids, mb.position_ids, mb.loss_mask))
            targets += mb.target_tokens
    return total / targets


@pytest.mark.slow
def test_qlora_shards_nf4_weights_with_fsdp2_on_two_processes(
    tmp_path: Path, tiny_model_dir: Path, packed_dir: Path
) -> None:
    """Two processes, data_parallel=shard: FSDP2 all-gathers the NF4 weights (torchao's
    all-gather extension) and the losses are those of one process (same global batch)."""
    one = tmp_path / "one"
    proc = run_trainer(tiny_model_dir, packed_dir, one, *QLORA, "--max-steps", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = tmp_path / "two"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "-m", "trainer",
         "--model", str(tiny_model_dir), "--data", str(packed_dir), "--output", str(two),
         "--micro-batch-size", "1", "--log-every", "1", "--tensorboard", "false",
         "--data-parallel", "shard", "--max-steps", "3", *QLORA],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "data_parallel=shard ignored" not in proc.stderr
    for step, loss in losses(one).items():
        assert losses(two)[step] == pytest.approx(loss, abs=1e-5)


def test_config_refuses_nf4_and_dpo_without_lora() -> None:
    errors = TrainConfig(model="m", data="d", output="o", quantize_base="nf4").errors()
    assert any("quantize_base=nf4" in e and "lora_rank" in e for e in errors)
    errors = TrainConfig(model="m", data="d", output="o", objective="dpo").errors()
    assert any("objective=dpo" in e and "lora_rank" in e for e in errors)
    errors = TrainConfig(model="m", data="d", output="o", quantize_base="int4").errors()
    assert any("quantize_base must be none or nf4" in e for e in errors)
    assert not TrainConfig(
        model="m", data="d", output="o", lora_rank=8, quantize_base="nf4", objective="dpo"
    ).errors()


@pytest.mark.slow
def test_gpu_check_qlora_case_dry_run_on_cpu(tmp_path: Path) -> None:
    """benchmarks/gpu_check.py --case qlora, as the GPU check runs it, on a tiny model on CPU: the
    script, its trainer flags and its RESULT line work before a GPU is spent on them."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--case", "qlora",
         "--compile", "false", "--seq-len", "128", "--steps", "12", "--warmup-steps", "1",
         "--micro-batch-size", "1", "--workdir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    assert result["case"] == "qlora" and result["steady_steps"] == 11
    assert result["peak_memory_gb"] > 0
