"""Fault: SIGKILL of `llmft run --backend local` left its run running (issue 37, fourth bullet,
the pipeline half; tests/faults/test_orphans.py has `llmft train`).

kfp.local's task processes, the torchrun agents under the train task and the etcd step's etcd
kept running (ports, data dir) after the runner was killed. Now the runner's watchdog stops every
process of the run and sweeps its state. Waits on signals: the trainer's first metrics record, then
the run's processes ending (failsafe deadline only).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from test_pipeline_local import (
    CliRun,
    _assert_nothing_left,
    _params,
    _run_processes,
    _training_started,
)

from faults.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_sigkill_of_llmft_run_leaves_nothing_running(
    tmp_path: Path, sample_data_dir: Path, tiny_model_dir: Path
):
    workdir = tmp_path / "run"
    params = _params(
        workdir,
        (sample_data_dir, tiny_model_dir),
        max_steps=100000,
        trainer_overrides={"log_every": 1},
        nproc_per_node=1,  # 2 nodes x 1: two agents, without two more trainer interpreters
    )
    run = CliRun(["run", "--backend", "local", *params], "pipe")
    try:
        wait_for(lambda: _training_started(workdir), "training to start", timeout_s=600)
        assert len(_run_processes(workdir)) > 3  # tasks, agents, trainers, etcd
        os.kill(run.pid, signal.SIGKILL)  # the runner alone: its children are the watchdog's
        wait_for(lambda: not _run_processes(workdir), "the watchdog to stop the run")
        _assert_nothing_left(workdir)
        assert "[watchdog]" in (workdir / "logs" / "watchdog.log").read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
