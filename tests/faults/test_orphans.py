"""Fault: a launcher's death left its run running (issue 37, fourth bullet).

SIGKILL of `llmft train` (or `llmft run`), or SIGHUP from a closed terminal, left torchrun agents,
trainers and etcd running, holding their ports and data dir, and the `llmft cleanup` the docs
mentioned did not exist. Now the agents and the run's etcd die with the launcher (parent-death
signal), SIGHUP cancels the run like SIGTERM, a local pipeline run has a watchdog on its runner's
pid, and `llmft cleanup` removes what a dead run left (state, etcd data dir).

The tests wait on explicit signals: the trainer pauses after step 1 and says so with a file
(tests/trainer_pause), and process ends are polled with a failsafe deadline only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from test_cli_errors import llmft
from trainer_pause.sitecustomize import pause_env

from faults.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _gone(pids: list[int]) -> bool:
    from components.runtime.lifeline import alive

    return not any(alive(pid) for pid in pids)


def _start_train(
    started: list[subprocess.Popen], model: Path, data: Path, tmp_path: Path
) -> tuple[subprocess.Popen, str, dict]:
    """`llmft train` (etcd-v3: it starts the run's own etcd) paused after step 1; returns the
    process, the run's marker and its etcd's recorded state, once the trainer is paused. One
    node: each agent dies with the launcher on its own (parent-death signal), so a second one
    (a second agent and worker, both importing torch) adds nothing to what is proven."""
    from components.runtime.run_identity import run_state_dir

    run_id = f"orphan-{uuid.uuid4().hex[:8]}"
    ready = tmp_path / "ready"
    ready.mkdir()
    cmd = [
        sys.executable, "-m", "pipelines.cli", "train", "--model", str(model), "--data", str(data),
        "--output", str(tmp_path / "run"), "--max-steps", "50", "--run-id", run_id,
        "--set", "log_every=1", "--set", "tensorboard=false", "--nodes", "1",
    ]  # fmt: skip
    # Started as from a terminal, SIGHUP at its default even when the tests run under `nohup`
    # (which `llmft train` honours: an ignored SIGHUP stays ignored).
    hangup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=pause_env(1, str(ready)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    finally:
        signal.signal(signal.SIGHUP, hangup)
    started.append(proc)
    wait_for(lambda: (ready / "paused.rank0").exists() or proc.poll() is not None, "step 1")
    assert proc.poll() is None, f"llmft train ended early with {proc.returncode}"
    state = run_state_dir(run_id)
    etcd = json.loads((state / "etcd.json").read_text())
    return proc, str(state), etcd


def test_sigkill_of_llmft_train_takes_its_run_down_and_cleanup_removes_the_rest(
    started, tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    from components.launchers.run_processes import marked_pids

    proc, marker, etcd = _start_train(started, tiny_model_dir, small_dataset, tmp_path)
    run_processes = marked_pids(marker)
    assert run_processes  # the agent and its worker

    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for(lambda: _gone([*run_processes, etcd["pid"]]), "the agents, trainer and etcd to end")
    assert Path(etcd["data_dir"]).is_dir() and Path(marker).is_dir()  # what cleanup is for

    result = llmft("cleanup")
    assert result.exit_code == 0, result.output
    assert Path(marker).name in result.output
    assert not Path(etcd["data_dir"]).exists()
    assert not Path(marker).exists()


def test_sighup_cancels_llmft_train_like_sigterm(
    started, tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    from components.launchers.run_processes import marked_pids

    proc, marker, etcd = _start_train(started, tiny_model_dir, small_dataset, tmp_path)
    run_processes = marked_pids(marker)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=180) == 130  # cancelled, after stopping what it started
    assert _gone([*run_processes, etcd["pid"]])
    assert not Path(etcd["data_dir"]).exists()
    assert not Path(marker).exists()


RUNNER = """
import json, signal, subprocess, sys
from pathlib import Path
from components.etcd import local as etcd_local
from pipelines.watchdog import Watchdog

root, ready = Path(sys.argv[1]), Path(sys.argv[2])
Watchdog(root, root.parent / "watchdog.log").start()
etcd_local.start("pipeline-run", detached=True, root=root)  # as the pipeline's etcd step does
child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
written = ready.with_name(ready.name + ".tmp")  # renamed into place: never read half-written
written.write_text(json.dumps({"child": child.pid}))
written.replace(ready)
signal.pause()
"""


def test_watchdog_stops_a_local_pipeline_run_whose_runner_was_killed(started, tmp_path: Path):
    """`llmft run --backend local` in miniature: a runner with a watchdog, an etcd started like
    the pipeline's etcd step (it outlives its task, so no parent-death signal), and a task."""
    root, ready = tmp_path / "state", tmp_path / "ready.json"
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(root), str(ready)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    started.append(runner)
    wait_for(lambda: ready.exists() or runner.poll() is not None, "the runner to start")
    assert runner.poll() is None
    etcd = json.loads((root / "pipeline-run" / "etcd.json").read_text())
    child = json.loads(ready.read_text())["child"]

    runner.send_signal(signal.SIGKILL)
    runner.wait()
    wait_for(lambda: _gone([child, etcd["pid"]]), "the watchdog to stop the run")
    wait_for(lambda: not (root / "pipeline-run").exists(), "the watchdog to clean the state")
    assert not Path(etcd["data_dir"]).exists()


WORKER = """
import os, signal, sys
from pathlib import Path
from trainer.startup import stop_with_agent

out = Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: (out.joinpath("sigterm").touch(), os._exit(0)))
stop_with_agent()
out.joinpath("ready").touch()
signal.pause()
"""
AGENT = """
import os, signal, subprocess, sys
from pathlib import Path

out = Path(sys.argv[2])
env = {**os.environ, "TORCHELASTIC_RUN_ID": "orphan-test"}  # as torchrun sets it for workers
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(out)], env=env)
out.joinpath("worker.pid.tmp").write_text(str(worker.pid))
out.joinpath("worker.pid.tmp").replace(out / "worker.pid")  # never read half-written
signal.pause()
"""


def test_a_trainer_worker_stops_when_its_agent_dies_without_stopping_it(started, tmp_path: Path):
    """An agent killed before it stopped its workers left a trainer worker running (the SIGKILL
    test above found one 40 minutes later); the worker now gets SIGTERM, the trainer's preemption
    signal, from Linux the moment its agent dies (`trainer.startup.stop_with_agent`)."""
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, WORKER, str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    started.append(agent)
    up = [tmp_path / "ready", tmp_path / "worker.pid"]  # in either order
    wait_for(lambda: all(p.exists() for p in up) or agent.poll() is not None, "the worker")
    assert agent.poll() is None
    worker = int((tmp_path / "worker.pid").read_text())
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    wait_for(lambda: (tmp_path / "sigterm").exists(), "the worker's SIGTERM")
    wait_for(lambda: _gone([worker]), "the worker to end")
