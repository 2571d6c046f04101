"""Trainer config: file + flags, types, every error reported at once, one-line CLI errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import TrainConfig
from trainer.config_args import describe_fields, load_config

REPO = Path(__file__).resolve().parents[1]
REQUIRED = ["--model", "m", "--data", "d", "--output", "o"]


def test_flags_override_yaml_and_types_are_coerced(tmp_path: Path) -> None:
    cfg_file = tmp_path / "train.yaml"
    cfg_file.write_text("lr: 0.001\nmicro_batch_size: 8\ncompile: true\nlora_rank: 8\n")
    cfg = load_config(
        [*REQUIRED, "--config", str(cfg_file), "--micro-batch-size", "2", "--max_steps=7",
         "--no-compile", "--lora-target-modules", "q_proj,v_proj", "--activation-checkpointing"]
    )  # fmt: skip
    assert cfg.lr == 0.001 and cfg.lora_rank == 8  # from the file
    assert cfg.micro_batch_size == 2 and cfg.max_steps == 7  # flags win
    assert cfg.compile is False and cfg.activation_checkpointing is True
    assert cfg.lora_target_modules == ["q_proj", "v_proj"]
    assert cfg.seq_len is None and cfg.backend == "auto"  # defaults


def test_all_errors_are_reported_together(tmp_path: Path) -> None:
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text("lr: -1\nwarmup: 3\n")
    with pytest.raises(ValueError) as info:
        load_config(
            ["--data", "d", "--config", str(cfg_file), "--micro-batch-size", "zero",
             "--dtype", "fp8", "--max-steps", "5", "--warmup-steps", "9", "--bogus", "1"]
        )  # fmt: skip
    message = str(info.value)
    assert "\n" not in message
    for expected in (
        "--model is required",
        "--output is required",
        "lr must be > 0",
        "unknown field(s) in",
        "warmup",
        "micro_batch_size must be an integer (got 'zero')",
        "dtype must be auto, bf16 or fp32",
        "warmup_steps (9) must be below max_steps (5)",
        "unknown option --bogus",
    ):
        assert expected in message, (expected, message)


def test_every_field_is_documented() -> None:
    docs = describe_fields()
    fields = set(TrainConfig.__dataclass_fields__)
    assert fields == set(docs), fields ^ set(docs)
    assert all(len(text) > 10 for text in docs.values())


@pytest.mark.integration  # a fresh trainer process
def test_cli_config_error_is_one_line_exit_2() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--model", "m", "--data", "d", "--epochs", "0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: invalid trainer config:")
    assert "--output is required" in lines[0] and "epochs must be >= 1" in lines[0]


def test_config_json_round_trip_is_exact() -> None:
    """Launchers hand the whole config to every rank as one JSON argument."""
    from trainer.config import TrainConfig
    from trainer.config_args import load_config

    config = TrainConfig(
        model="gs://b/m", data="/d", output="/o", max_steps=7, lr=3e-4, seq_len=None,
        lora_rank=8, lora_target_modules=["q_proj"], activation_checkpointing=True,
        eval_max_rows=None, peak_flops=1.5e14, tokenizer="tok",
    )  # fmt: skip
    assert TrainConfig.from_json(config.to_json()) == config
    assert load_config(["--config-json", config.to_json()]) == config
    assert TrainConfig.from_json(TrainConfig(model="m", data="d", output="o").to_json()) == (
        TrainConfig(model="m", data="d", output="o")
    )


def test_config_json_reports_every_problem() -> None:
    from trainer.config_args import load_config

    with pytest.raises(ValueError) as err:
        load_config(["--config-json", '{"model": "m", "max_steps": -5, "bogus": 1, "lr": "x"}'])
    text = str(err.value)
    assert "unknown field 'bogus'" in text and "lr must be a number" in text
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        load_config(
            ["--config-json", '{"model": "m", "data": "d", "output": "o", "max_steps": -5}']
        )
    with pytest.raises(ValueError, match="takes no other arguments"):
        load_config(["--config-json", "{}", "--lr", "1"])


@pytest.mark.parametrize("warmup", [0, 3])
def test_lr_schedule_peaks_once_and_ends_at_the_minimum(warmup: int) -> None:
    from trainer.startup import lr_lambda

    factors = [lr_lambda(warmup, 10, 0.1)(step) for step in range(10)]
    assert factors.count(1.0) == 1 and factors.index(1.0) == warmup
    assert factors[:warmup] == pytest.approx([(k + 1) / (warmup + 1) for k in range(warmup)])
    assert factors[-1] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(factors[warmup:], factors[warmup + 1 :], strict=False))


def test_compile_defaults_to_gpu_only_and_on_cpu_needs_a_cxx_toolchain(monkeypatch) -> None:
    import shutil

    import torch

    from trainer import startup
    from trainer.model import compiles

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert TrainConfig().compile is None
    assert compiles(TrainConfig(), gpu) and not compiles(TrainConfig(), cpu)
    assert not compiles(TrainConfig(compile=False), gpu)
    assert compiles(TrainConfig(compile=True), cpu)
    assert load_config([*REQUIRED, "--compile"]).compile is True  # the bare form of bool | None
    if torch.cuda.is_available():
        pytest.skip("checks the CPU toolchain")
    assert startup.cpu_compile_missing() is None  # this machine has g++ and Python's headers
    device, _ = startup.device_and_backend(TrainConfig(compile=True))
    assert device.type == "cpu"
    # Without a C++ compiler, compile=true on CPU stops before anything starts, naming the fix.
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match=r"no C\+\+ compiler .*apt-get install g\+\+"):
        startup.device_and_backend(TrainConfig(compile=True))
    startup.device_and_backend(TrainConfig())  # eager, the CPU default, needs none


def test_sdpa_kernels_setting() -> None:
    from trainer import attention
    from trainer.config import TrainConfig

    base = {"model": "m", "data": "d", "output": "o"}
    assert not TrainConfig(**base, sdpa_kernels="cudnn,flash,math").errors()
    (error,) = TrainConfig(**base, sdpa_kernels="cudnn,fa3").errors()
    assert "sdpa_kernels" in error and "'cudnn,fa3'" in error
    with attention.sdpa_kernels("cudnn,math"):
        assert attention._contiguous_inputs  # cuDNN first: dense inputs
    assert not attention._contiguous_inputs
    with attention.sdpa_kernels("auto"):
        assert not attention._contiguous_inputs


def test_a_rank_given_gpus_stops_when_cuda_is_unavailable(monkeypatch) -> None:
    """N1: on GKE without the driver on the loader path torch sees no CUDA; the old code then
    trained on CPU with gloo while the GPUs were billed."""
    import torch

    from trainer.cuda_guard import EXPECT_CUDA_ENV
    from trainer.startup import device_and_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(EXPECT_CUDA_ENV, "1")
    with pytest.raises(RuntimeError, match=r"given GPUs .* sees no CUDA"):
        device_and_backend(TrainConfig())
    monkeypatch.delenv(EXPECT_CUDA_ENV)
    device, backend = device_and_backend(TrainConfig())  # not given GPUs: CPU is intended
    assert device.type == "cpu" and backend == "gloo"
