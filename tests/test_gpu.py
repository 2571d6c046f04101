"""GPU tests: opt-in (`pytest -m gpu`), skipped where no CUDA device is present.

Run on a GPU machine with `pytest -m gpu tests/test_gpu.py`; the default run excludes the marker.
benchmarks/gpu_check.sh is the throughput/MFU check for an H200.
"""

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

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
REPO = Path(__file__).resolve().parents[1]


def test_trainer_bf16_fsdp2_on_one_gpu_learns_and_exports(
    tmp_path: Path, tiny_model_dir: Path, sample_data_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = tmp_path / "packed"
    records = read_jsonl(sample_data_dir / "train.jsonl", 400)
    write_packed_dataset(
        data,
        AutoTokenizer.from_pretrained(tiny_model_dir),
        {"train": records, "eval": records[:40]},
        seq_len=256,
    )
    port = ReservedPort()  # held until the trainer's store listens on it, i.e. for the run
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port.port)}  # fmt: skip
    out = tmp_path / "run"
    with port:
        proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--model", str(tiny_model_dir), "--data", str(data),
         "--output", str(out), "--max-steps", "30", "--lr", "3e-3", "--log-every", "1",
         "--tensorboard", "false"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = [
        json.loads(line)["loss"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    assert losses[-1] < losses[0] - 1.0
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert sum(p.numel() for p in model.parameters()) > 0
