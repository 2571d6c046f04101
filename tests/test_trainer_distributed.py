"""The trainer for real: 2 nodes x 2 processes on CPU, two torchrun agents, c10d rendezvous, gloo.

Runs of `python -m trainer` on the tiny model:
  A  uninterrupted, checkpoint every 3 steps: the loss falls, checkpoints and export are written,
     the exported model loads with from_pretrained and reproduces the run's eval loss;
  B  the same run with sharded weights (A replicates them) and time-based checkpoints, paused
     after step 2 and sent SIGTERM (a Spot preemption, SIGKILL after the grace deadline): the
     time-based checkpoint of step 1 is complete, the SIGTERM saves step 3, the workers exit;
  B' B rerun: resumes from B's checkpoint and reproduces A's losses step for step.
  C  resumes from A's (replicated, DDP) step-6 checkpoint: the same last losses and export.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from packed_fixtures import read_jsonl, write_packed_dataset
from trainer_pause.sitecustomize import pause_env

from components.runtime.ports import ReservedPort

REPO = Path(__file__).resolve().parents[1]
STEPS = 8
ARGS = [
    "--max-steps", str(STEPS), "--micro-batch-size", "2", "--grad-accum-steps", "2",
    "--lr", "2e-3", "--warmup-steps", "2", "--log-every", "1", "--checkpoint-every", "3",
    "--keep-checkpoints", "2", "--eval-max-rows", str(3), "--tensorboard", "false",
]  # fmt: skip
# A runs the tiny model replicated (data_parallel auto), B and B' shard it (ZeRO-3): B' matching A
# step for step checks both modes and that they compute the same update.
SHARDED = ("--data-parallel", "shard")
# 3 eval rows for 4 ranks: one rank has no eval batch and must still join every FSDP forward.
EVAL_ROWS = 3


PAUSE_AT_STEP = 2


def start_run(
    model: Path,
    data: Path,
    out: Path,
    nodes: int = 2,
    nproc: int = 2,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
):
    """`nodes` torchrun agents (own sessions, like separate machines) running the trainer.

    The c10d store's port stays reserved while the agents start (the first one listens on it)."""
    out.mkdir(parents=True, exist_ok=True)
    port, rdzv_id = ReservedPort(), uuid.uuid4().hex[:12]
    env = {
        **(env or os.environ),
        "OMP_NUM_THREADS": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    procs = []
    for node in range(nodes):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
            f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint={port.endpoint}",
            f"--rdzv-id={rdzv_id}", "--max-restarts=0", "--monitor-interval=0.2",
            "-m", "trainer", "--model", str(model), "--data", str(data), "--output", str(out),
            *ARGS, *extra,
        ]  # fmt: skip
        with open(out / f"agent{node}.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    _STORE_PORTS.append(port)  # released when the module's runs are over
    return procs


_STORE_PORTS: list[ReservedPort] = []


@pytest.fixture(scope="module", autouse=True)
def _release_store_ports():
    yield
    for port in _STORE_PORTS:
        port.release()


def wait(procs, timeout: float = 300) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:  # never leave an agent or worker behind, whatever happened
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def logs(out: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-4000:] for p in sorted(out.glob("agent*.log")))


def losses(out: Path) -> dict[int, float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


@pytest.fixture(scope="module")
def packed_dir(tmp_path_factory, tiny_model_dir: Path, sample_data_dir: Path) -> Path:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    out = tmp_path_factory.mktemp("packed128")
    write_packed_dataset(
        out,
        tokenizer,
        {
            "train": read_jsonl(sample_data_dir / "train.jsonl", 1200),
            "eval": read_jsonl(sample_data_dir / "heldout.jsonl", 100),
        },
        seq_len=128,
        rows_per_shard=40,
    )
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir: Path, packed_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("run_a")
    codes = wait(start_run(tiny_model_dir, packed_dir, out))
    assert codes == [0, 0], logs(out)
    return out


@pytest.mark.slow
def test_two_nodes_train_checkpoint_export(uninterrupted: Path, packed_dir: Path) -> None:
    out = uninterrupted
    run = losses(out)
    assert sorted(run) == list(range(1, STEPS + 1))
    assert sum(run[s] for s in range(STEPS - 2, STEPS + 1)) / 3 < run[1] - 0.5, run

    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == ["step-00000006", "step-00000008"]  # keep_checkpoints=2 pruned step 3
    for name in kept:
        assert (out / "checkpoints" / name / "COMPLETE").exists()
        assert (out / "checkpoints" / name / ".metadata").exists()
    state = json.loads((out / "checkpoints" / "step-00000008" / "trainer_state.json").read_text())
    assert state["step"] == STEPS and state["world_size"] == 4

    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["resumed_from_step"] is None
    assert summary["final_loss"] == pytest.approx(run[STEPS])
    assert summary["target_tokens"] > 0 and summary["tokens"] == STEPS * 2 * 2 * 4 * 128

    # The export is an ordinary HF directory that reproduces the run's eval loss.
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.data import eval_batches
    from trainer.packed_data.format import read_manifest

    assert (out / "model" / "model.safetensors").exists()
    assert (out / "model" / "tokenizer.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    manifest = read_manifest(str(packed_dir))
    total = count = 0.0
    with torch.no_grad():
        for mb in eval_batches(
            str(packed_dir), manifest, rank=0, world_size=1, micro_batch_size=8, max_rows=EVAL_ROWS
        ):
            logits = model(
                input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False
            ).logits
            labels = mb.labels()[:, 1:]
            total += torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"
            ).item()
            count += int((labels != -100).sum())
    assert total / count == pytest.approx(summary["eval_loss"], rel=1e-4)


@pytest.mark.slow
def test_replicated_checkpoint_resumes_and_exports(
    uninterrupted: Path, tiny_model_dir: Path, packed_dir: Path, tmp_path: Path
) -> None:
    """A's checkpoints come from DDP (plain tensors, A replicates): a run resumed from step 6
    reproduces A's last steps and exports the same weights."""
    import shutil

    from safetensors.torch import load_file

    out = tmp_path / "run_c"
    shutil.copytree(
        uninterrupted / "checkpoints" / "step-00000006", out / "checkpoints" / "step-00000006"
    )
    codes = wait(start_run(tiny_model_dir, packed_dir, out))
    assert codes == [0, 0], logs(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 6 and summary["steps"] == STEPS
    reference, resumed = losses(uninterrupted), losses(out)
    assert sorted(resumed) == [7, 8]
    for step in (7, 8):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-5, abs=1e-6), step
    exported = load_file(out / "model" / "model.safetensors")
    expected = load_file(uninterrupted / "model" / "model.safetensors")
    assert exported.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch_allclose(exported[name], tensor), name


def torch_allclose(a, b) -> bool:
    import torch

    return torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-6)


# Checkpoints by time only (no step interval): due at every step, so the test needs no clock.
TIME_CHECKPOINTS = ("--checkpoint-every", "0", "--checkpoint-every-minutes", "1e-6")


@pytest.mark.slow
def test_sigterm_saves_and_rerun_resumes_matching_uninterrupted(
    uninterrupted: Path, tiny_model_dir: Path, packed_dir: Path, tmp_path: Path
) -> None:
    """Spot preemption, rehearsed, on sharded weights (A replicates them) with time-based
    checkpoints only: every worker gets SIGTERM after step PAUSE_AT_STEP and, like a GKE Spot
    pod, SIGKILL once the grace deadline passes. A time-based checkpoint had landed before the
    SIGTERM; the SIGTERM saves the next step and the workers exit; the rerun resumes from it and
    its losses match A's step for step (both data-parallel modes compute the same update);
    summary.json counts the starts and the preemptions that saved. (One run for what were two
    tests: SIGTERM with step checkpoints, and the Spot rehearsal with time checkpoints.)"""
    from components.platform.platform_facts import GKE_SPOT_POD_GRACE_S
    from trainer.checkpoint_files import latest_checkpoint

    out = tmp_path / "run_b"
    paused = tmp_path / "paused"
    paused.mkdir()
    env = pause_env(PAUSE_AT_STEP, str(paused))
    extra = (*SHARDED, *TIME_CHECKPOINTS)
    procs = start_run(tiny_model_dir, packed_dir, out, extra=extra, env=env)
    in_time = False
    try:
        # Every rank waits after step PAUSE_AT_STEP until its SIGTERM arrives: preempt then.
        while len(list(paused.glob("paused.rank*"))) < 4:
            if any(p.poll() is not None for p in procs):
                pytest.fail("a run ended before it was preempted:\n" + logs(out))
            time.sleep(0.1)  # polling for the files, not waiting for time to pass
        # Paused in step PAUSE_AT_STEP's metrics write, before its own save: the time-based
        # checkpoint of the step before must already be complete.
        before = latest_checkpoint(str(out / "checkpoints"))
        assert before is not None and before[0] == PAUSE_AT_STEP - 1, logs(out)
        for p in procs:
            os.kill(p.pid, signal.SIGTERM)
        # The grace deadline: 8x GKE's 15 s, for a loaded 2-core machine; then SIGKILL (wait()).
        with contextlib.suppress(subprocess.TimeoutExpired):
            [p.wait(timeout=8 * GKE_SPOT_POD_GRACE_S) for p in procs]
            in_time = True
    finally:  # SIGKILL whatever is left, as the node's shutdown would
        with contextlib.suppress(subprocess.TimeoutExpired):
            wait(procs, timeout=1)
    log_text = logs(out)
    assert in_time, "the SIGTERM save did not finish within the grace deadline:\n" + log_text
    assert "SIGTERM: saved step" in log_text, log_text
    latest = latest_checkpoint(str(out / "checkpoints"))
    # the ranks agree to stop in the next step's all-reduce
    assert latest is not None and latest[0] == PAUSE_AT_STEP + 1, log_text
    assert not (out / "summary.json").exists()

    codes = wait(start_run(tiny_model_dir, packed_dir, out, extra=extra))
    assert codes == [0, 0], logs(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == latest[0] and summary["steps"] == STEPS
    assert summary["attempts"] == 2 and summary["preemptions"] == 1
    reference, resumed = losses(uninterrupted), losses(out)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-5, abs=1e-6), step
