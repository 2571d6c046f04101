"""GPU throughput check: a ~1B-parameter Llama, random init, bf16, FSDP2 on 1 GPU, torch.compile.

Run through `bash benchmarks/gpu_check.sh` (it sets the time limit). Steps:
  1. save a random-init ~1.1B Llama (TinyLlama-1.1B shape: 22 layers, hidden 2048, GQA 32/4
     heads, vocab 32000) with a small BPE tokenizer, as a Hugging Face directory;
  2. write a synthetic packed dataset that satisfies trainer/packed_data/format.py: one document per
     row, every token but the first a target, as in continued pre-training on long documents;
  3. `torchrun --nproc-per-node 1 -m trainer ... --dtype bf16 --compile true`, one FSDP2 unit per
     block, weights kept gathered between forward and backward (one GPU: nothing to save by
     resharding);
  4. print steady-state tokens/s and MFU from metrics.jsonl, the first `--warmup-steps` steps
     (compilation, allocator warm-up) excluded.
MFU = tokens/s x FLOPs per token / peak bf16 FLOP/s (trainer/metrics.py): 6 x matmul parameters +
12 x layers x hidden x seq_len, the PaLM / torchtitan convention (attention counted without
halving for causality). One document per row keeps the attention term honest: with short packed
documents, per-document attention skips most of the L x L scores that the formula credits.
The last line is `RESULT {json}`. Target: MFU >= 0.60 on an H100/H200.

`--case smollm2-lora` measures the step of `make demo-real` instead: SmolLM2-135M's shape (random
weights), LoRA rank 16 on q_proj/v_proj, seq_len 256, micro-batch 2, rows packed with
instruction-sized documents; it reports seconds per step, which prices the demo on a GPU.

`--case qlora` runs the 1B model as QLoRA (issue 34): the decoder blocks' linear weights in NF4
(`--quantize-base nf4`), LoRA rank 16 on every projection, one process (DDP: an NF4 base is not
sharded on one GPU), 2048-token rows, 20 steps: about 2 minutes. It reports MFU with the LoRA
FLOP count (4 x matmul parameters per token: no weight gradients for the base) and the peak
memory, to compare with trainer/memory_model.py. `--dry-run` runs any case on a tiny model on
CPU (tests/test_qlora.py runs it), which checks the script, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


SHAPES = {
    # TinyLlama-1.1B's shape: the MFU target's model.
    "llama-1b": {
        "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
        "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
    # SmolLM2-135M-Instruct's shape (its config.json): `make demo-real`'s model, random weights.
    "smollm2": {
        "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "tie_word_embeddings": True, "rope_theta": 100000.0,
    },
}  # fmt: skip
"""Model shapes the cases use."""
QLORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
CASES: dict[str, dict[str, Any]] = {
    "llama-1b": {
        "shape": "llama-1b",
        "flags": ["--reshard-after-forward", "false", "--lr", "3e-4"],
        "defaults": {"seq_len": 4096, "micro_batch_size": 4},
    },
    # pipelines/quickstart/demo_real.yaml's trainer settings that change the step's cost.
    "smollm2-lora": {
        "shape": "smollm2",
        "flags": [
            "--lora-rank", "16", "--lora-alpha", "32", "--lora-target-modules", "q_proj,v_proj",
            "--lr", "3e-4",
        ],
        "defaults": {"seq_len": 256, "micro_batch_size": 2},
        "documents": True,
    },
    "qlora": {
        "shape": "llama-1b",
        "flags": [
            "--quantize-base", "nf4", "--lora-rank", "16", "--lora-alpha", "32",
            "--lora-target-modules", QLORA_TARGETS, "--lr", "2e-4",
        ],
        # Under 2 minutes on an H200 (model creation and NF4 quantization included).
        "defaults": {"seq_len": 2048, "micro_batch_size": 4, "steps": 20, "warmup_steps": 5},
    },
}  # fmt: skip
"""Each case: the model shape, its trainer flags, the defaults it changes when the flag was not
given, and whether rows hold instruction-sized documents."""


def make_model(out: Path, case: str, dry_run: bool = False) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipelines.quickstart.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(None, vocab_size=4096)
    shape = dict(SHAPES[CASES[case]["shape"]])
    if dry_run:
        shape |= {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
        shape |= {"num_attention_heads": 4, "num_key_value_heads": 2}
    config = LlamaConfig(
        **shape,
        max_position_embeddings=8192,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def make_data(out: Path, tokenizer_dir: Path, seq_len: int, rows: int, documents: bool) -> None:
    """Rows of one document each, or (`documents`) of instruction-sized documents (32-128 tokens,
    the second half of each a target) as the demo's packed rows hold."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from trainer.packed_data.format import Manifest, SplitInfo, TokenizerIdentity

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = np.random.default_rng(0)
    ids = rng.integers(10, len(tokenizer), size=(rows, seq_len), dtype=np.int64)
    pos = np.tile(np.arange(seq_len, dtype=np.int64), (rows, 1))  # one document per row
    mask = (pos != 0).astype(np.int64)
    count = rows
    if documents:
        count = 0
        for row in range(rows):
            start = 0
            while start < seq_len:
                length = min(int(rng.integers(32, 129)), seq_len - start)
                pos[row, start : start + length] = np.arange(length)
                mask[row, start : start + length] = np.arange(length) >= length // 2
                start, count = start + length, count + 1
    (out / "train").mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"input_ids": list(ids), "loss_mask": list(mask), "position_ids": list(pos)}),
        out / "train" / "part-00000.parquet",
    )
    manifest = Manifest(
        seq_len=seq_len,
        tokenizer=TokenizerIdentity.of(tokenizer),
        data_kind="text",
        splits={
            "train": SplitInfo(
                rows=rows,
                documents=count,
                tokens=rows * seq_len,
                target_tokens=int(mask.sum()),
                shards=["train/part-00000.parquet"],
            )
        },
        stats={"source": "benchmarks/gpu_check.py synthetic"},
    )
    (out / "manifest.json").write_text(manifest.to_json())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/llmft-gpu-check")
    parser.add_argument("--case", choices=tuple(CASES), default="llama-1b")
    parser.add_argument("--seq-len", type=int, default=None, help="default: the case's")
    parser.add_argument("--micro-batch-size", type=int, default=None, help="default: the case's")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument(
        "--compile", choices=("true", "false"), default="true", help="false: the eager baseline"
    )
    parser.add_argument(
        "--sdpa-kernels", default="auto", help="the trainer's sdpa_kernels, e.g. cudnn,flash,math"
    )
    parser.add_argument("--extra", nargs="*", default=[], help="more trainer flags")
    parser.add_argument(
        "--dry-run", action="store_true", help="a tiny model on CPU: checks this script only"
    )
    args = parser.parse_args()
    case = CASES[args.case]
    given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in sys.argv[1:]}
    for name, value in case["defaults"].items():
        if name not in given:
            setattr(args, name, value)
    work = Path(args.workdir) / args.case
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    params = make_model(work / "model", args.case, dry_run=args.dry_run)
    print(f"model: {params / 1e9:.2f}B parameters ({time.time() - started:.0f}s)", flush=True)
    rows = args.micro_batch_size * args.steps
    make_data(
        work / "data",
        work / "model",
        args.seq_len,
        rows=rows,
        documents=case.get("documents", False),
    )
    out = Path(tempfile.mkdtemp(dir=work, prefix="out-"))  # several calls may share a workdir
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
        "-m", "trainer", "--model", str(work / "model"), "--data", str(work / "data"),
        "--output", str(out), "--max-steps", str(args.steps),
        "--micro-batch-size", str(args.micro_batch_size), "--dtype", "bf16", "--compile", args.compile,
        *case["flags"], "--warmup-steps", "5", "--log-every", "1", "--export", "false",
        "--eval-at-end", "false", "--checkpoint-at-end", "false", "--resume", "false",
        "--sdpa-kernels", args.sdpa_kernels, *args.extra,
    ]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    code = subprocess.call(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": path})
    if code != 0:
        sys.exit(f"trainer failed with exit code {code}")
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [x for x in lines if "loss" in x and x["step"] > args.warmup_steps]
    if len(steady) < 10:
        sys.exit(f"only {len(steady)} steady steps: raise --steps above --warmup-steps + 10")
    # Every step has the same tokens: total tokens / total time is the harmonic mean of the
    # per-step rates, and MFU (proportional to the rate) averages the same way.
    tokens_per_s = len(steady) / sum(1 / x["tokens_per_s"] for x in steady)
    mfus = [x["mfu"] for x in steady if x["mfu"] is not None]
    mfu = len(mfus) / sum(1 / m for m in mfus) if len(mfus) == len(steady) else None
    step_s = args.micro_batch_size * args.seq_len / tokens_per_s
    result = {
        "case": args.case,
        "sdpa_kernels": args.sdpa_kernels,
        "extra": args.extra,
        "parameters": params,
        "step_s": step_s,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu,
        "peak_memory_gb": max(x["peak_memory_gb"] for x in steady),
        "final_loss": steady[-1]["loss"],
        "steady_steps": len(steady),
        "seq_len": args.seq_len,
        "micro_batch_size": args.micro_batch_size,
        "compile": args.compile == "true",
        "wall_s": time.time() - started,
    }
    print(
        f"tokens/s: {tokens_per_s:,.0f}  MFU: {mfu if mfu is None else f'{mfu:.1%}'} (target 60%)"
    )
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
