"""One-process runs of `python -m trainer` (env:// rendezvous, gloo): LoRA export, NaN stop, and
which data-parallel layout (DDP or FSDP2) a model gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packed_fixtures import read_jsonl, write_packed_dataset

from components.runtime.ports import ReservedPort

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def packed_dir(tmp_path_factory, tiny_model_dir: Path, sample_data_dir: Path) -> Path:
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("packed_single")
    records = read_jsonl(sample_data_dir / "train.jsonl", 200)
    write_packed_dataset(
        out,
        AutoTokenizer.from_pretrained(tiny_model_dir),
        {"train": records, "eval": records[:30]},
        seq_len=128,
    )
    return out


def run_trainer(model: Path, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    port = ReservedPort()  # held for the run: the trainer's store takes it over
    env = {
        **os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port.port), "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    with port:
        return subprocess.run(
        [sys.executable, "-m", "trainer", "--model", str(model), "--data", str(data),
         "--output", str(out), "--micro-batch-size", "2", "--log-every", "1",
         "--tensorboard", "false", *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_lora_exports_adapter_and_merged_model(
    tmp_path: Path, tiny_model_dir: Path, packed_dir: Path
) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "lora"
    proc = run_trainer(
        tiny_model_dir, packed_dir, out, "--max-steps", "4", "--lr", "1e-2", "--lora-rank", "8",
        "--lora-target-modules", "q_proj,v_proj", "--checkpoint-every", "2", "--warmup-steps", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The logged lr is the one each step used: half-way warmup, the peak once, the cosine's
    # midpoint, and lr x min_lr_ratio (0.1) at the last step.
    logged = [m["lr"] for m in read_jsonl(out / "metrics.jsonl") if "lr" in m]
    assert logged == pytest.approx([5e-3, 1e-2, 5.5e-3, 1e-3])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["eval_loss"] is not None
    assert (out / "model" / "adapter" / "adapter_config.json").exists()

    base = load_file(tiny_model_dir / "model.safetensors")
    merged = load_file(out / "model" / "model.safetensors")
    assert set(merged) == set(base)  # a plain model: no lora_ keys, same names as the base
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(("q_proj" in k or "v_proj" in k) for k in changed), changed

    ids = torch.tensor([[5, 17, 99, 300, 42, 7]])
    merged_model = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), out / "model" / "adapter"
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            merged_model(ids).logits, adapted(ids).logits, atol=1e-4, rtol=1e-4
        )


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(
    tmp_path: Path, tiny_model_dir: Path, packed_dir: Path
) -> None:
    out = tmp_path / "nan"
    # lr=1e30: step 1 is finite, its update blows the weights up, step 2's loss is not finite.
    proc = run_trainer(
        tiny_model_dir, packed_dir, out, "--max-steps", "5", "--lr", "1e30",
        "--max-grad-norm", "0", "--checkpoint-every", "1", "--keep-checkpoints", "3",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "is not finite" in line and "last complete checkpoint" in line
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-00000001"]
    assert (out / "checkpoints" / "step-00000001" / "COMPLETE").exists()
    assert not (out / "summary.json").exists()


_LAYOUT_PROBE = """
import json, sys, torch, torch.distributed as dist
from torch.distributed.tensor import DTensor
from trainer.config import TrainConfig
from trainer.model import build_model
dist.init_process_group("gloo")
out = {}
for mode in ("auto", "shard"):
    config = TrainConfig(model=sys.argv[1], data="d", output="o", data_parallel=mode)
    root = build_model(config, sys.argv[1], torch.device("cpu"))
    params = list(root.parameters())
    out[mode] = {
        "replicated": root.replicated,
        "dtensors": sum(isinstance(p, DTensor) for p in params),
        "params": len(params),
        "gradient_sync": hasattr(root, "set_requires_gradient_sync"),
        "keys": sorted(root.state_dict()),
    }
print(json.dumps(out))
dist.destroy_process_group()
"""


def run_probe(script: str, *args: str) -> dict:
    """Run `script` as rank 0 of a one-process gloo group; the JSON its last line prints."""
    port = ReservedPort()
    env = {
        **os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port.port), "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }  # fmt: skip
    with port:
        proc = subprocess.run(
            [sys.executable, "-c", script, *args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_small_models_replicate_with_ddp_plain_tensors(tiny_model_dir: Path) -> None:
    """data_parallel auto picks DDP for the tiny model: no DTensor parameter, the same state-dict
    keys as FSDP2's "shard" layout (checkpoints and exports are interchangeable), and gradient
    sync switchable for accumulation micro-batches either way."""
    layouts = run_probe(_LAYOUT_PROBE, str(tiny_model_dir))
    ddp, fsdp = layouts["auto"], layouts["shard"]
    assert ddp["replicated"] and ddp["dtensors"] == 0 and ddp["params"] > 0
    assert not fsdp["replicated"] and fsdp["dtensors"] == fsdp["params"]
    assert ddp["gradient_sync"] and fsdp["gradient_sync"]
    assert ddp["keys"] == fsdp["keys"]


_COMPILE_PROBE = """
import json, sys, torch, torch.distributed as dist
from trainer import last_block
from trainer.config import TrainConfig
from trainer.model import build_model, decoder_blocks
dist.init_process_group("gloo")
torch.manual_seed(0)
ids = torch.randint(0, 200, (2, 64))
positions = torch.cat([torch.arange(40), torch.arange(24)]).repeat(2, 1)
mask = (torch.rand(2, 64) < 0.5).long()
out = {}
for compile in (False, True):
    config = TrainConfig(model=sys.argv[1], data="d", output="o", compile=compile)
    root = build_model(config, sys.argv[1], torch.device("cpu"))
    blocks = decoder_blocks(root, root.causal_lm().config.num_hidden_layers)
    loss = root(ids, positions, mask)
    loss.backward()
    out[str(compile)] = {
        "compiled": [isinstance(b, torch._dynamo.eval_frame.OptimizedModule) for b in blocks],
        "rows_path": last_block.last_layer(root.causal_lm().get_decoder()) is not None,
        "loss": loss.item(),
        "grads": {
            n.replace("._orig_mod", ""): p.grad.norm().item() for n, p in root.named_parameters()
        },
    }
print(json.dumps(out))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_compile_on_cpu_leaves_the_last_block_eager_on_target_rows(tiny_model_dir: Path) -> None:
    """On CPU, `compile: true` compiles every decoder block but the last, which keeps its
    target-rows path (trainer/last_block.py: 1.077x the eager step, docs/performance.md); the
    loss and every gradient equal the eager model's to float tolerance."""
    runs = run_probe(_COMPILE_PROBE, str(tiny_model_dir))
    eager, compiled = runs["False"], runs["True"]
    assert not any(eager["compiled"])
    assert compiled["compiled"] == [True] * (len(compiled["compiled"]) - 1) + [False]
    assert eager["rows_path"] and compiled["rows_path"]
    assert compiled["loss"] == pytest.approx(eager["loss"], rel=1e-5)
    for name, norm in eager["grads"].items():
        assert compiled["grads"][name] == pytest.approx(norm, rel=1e-4, abs=1e-7), name


_SCALING_PROBE = """
import json, sys, torch, torch.distributed as dist
from trainer.config import TrainConfig
from trainer.data import MicroBatch
from trainer.model import build_model
from trainer.run_state import Run
from trainer.startup import build_optimizer
from trainer.step import optimizer_step
dist.init_process_group("gloo")
torch.manual_seed(0)
ids = torch.randint(0, 200, (2, 64))
positions = torch.cat([torch.arange(40), torch.arange(24)]).repeat(2, 1)
micro = [MicroBatch(ids, positions, (torch.rand(2, 64) < 0.5).long())]
out = {}
for fused in (True, False):
    # adam_eps 1: the update follows the gradient's scale (Adam alone is nearly scale-free)
    config = TrainConfig(
        model=sys.argv[1], data="d", output="o", lr=1e-2, max_grad_norm=0.5, adam_eps=1.0
    )
    device = torch.device("cpu")
    run = Run(config=config, device=device, rank=0, world_size=1, output="o")
    run.model = build_model(config, sys.argv[1], device)
    run.optimizer = build_optimizer(config, run.model, device)
    if not fused:  # the foreach kernel: the gradients are scaled by a pass of their own
        for group in run.optimizer.param_groups:
            group["fused"], group["foreach"] = False, True
        run.optimizer.defaults["fused"] = False
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: 1.0)
    norms = [optimizer_step(run, micro).grad_norm for _ in range(3)]
    out[str(fused)] = {
        "norms": norms,
        "params": {n: p.detach().flatten()[:64].tolist() for n, p in run.model.named_parameters()},
        "grad_scale_left": hasattr(run.optimizer, "grad_scale"),
    }
print(json.dumps(out))
dist.destroy_process_group()
"""


def test_fused_adamw_unscales_as_the_scaling_pass_did(tiny_model_dir: Path) -> None:
    """Fused AdamW divides by `grad_scale` what the foreach path multiplies by the coefficient
    (1 / targets, clipped): three clipped steps give the same weights either way, and no scale
    is left on the optimizer for a later step."""
    runs = run_probe(_SCALING_PROBE, str(tiny_model_dir))
    fused, foreach = runs["True"], runs["False"]
    assert fused["norms"][0] > 0.5  # clipping applies
    assert fused["norms"] == pytest.approx(foreach["norms"], rel=1e-4)
    assert not fused["grad_scale_left"]
    for name, values in foreach["params"].items():
        assert fused["params"][name] == pytest.approx(values, rel=1e-4, abs=1e-6), name


@pytest.mark.parametrize(
    ("workers", "rank", "threads", "expected"),
    [
        (2, 0, 1, [0]),
        (2, 1, 1, [1]),
        (1, 0, 1, [0, 1]),  # one worker keeps every core
        (2, 1, 2, None),  # 2 threads would share 1 core: left unbound
        (3, 2, 1, None),  # fewer cores than workers
    ],
)
def test_cpu_workers_are_bound_to_their_own_cores(workers, rank, threads, expected) -> None:
    """Under torchrun, local rank r of n takes the r-th slice of the cores it may use (here the
    first two this machine allows, as `taskset` would give them; numbered 0 and 1 below); the
    threads it starts later inherit that."""
    probe = (
        "import json, os, threading, torch\n"
        "from trainer.startup import bind_cpu_cores\n"
        "first_two = sorted(os.sched_getaffinity(0))[:2]\n"
        "os.sched_setaffinity(0, first_two)\n"
        "bound = bind_cpu_cores()\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))\n"
        "t.start(); t.join()\n"
        "index = {core: i for i, core in enumerate(first_two)}\n"
        "print(json.dumps({'bound': bound and [index[c] for c in bound],\n"
        "                  'thread': [index[c] for c in seen[0]]}))\n"
    )
    env = {
        **os.environ, "TORCHELASTIC_RUN_ID": "t", "LOCAL_WORLD_SIZE": str(workers),
        "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO),
    }  # fmt: skip
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bound"] == expected
    assert result["thread"] == (expected or [0, 1])
