"""The local launcher for real: torchrun agents as separate processes, a real gloo process group,
real rendezvous (etcd-v3 through a local etcd when available, else c10d), real signals.

Each test checks that nothing is left behind: no process carrying the run's marker, no state dir.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from components.launchers import LaunchFailed, TrainLaunch
from components.launchers.local import LocalLauncher, LocalOptions
from components.launchers.run_processes import marked_pids
from components.steps.train import launcher, train
from trainer.config import TrainConfig

WORKER = str(Path(__file__).parent / "launcher_workers" / "dist_worker.py")
ROOT = Path(__file__).resolve().parents[1]


def _etcd_available() -> bool:
    try:
        from components.etcd import local  # noqa: F401
    except ImportError:
        return False
    try:
        from trainer.rendezvous import etcd_v3  # noqa: F401
    except ImportError:
        return False
    return True


RDZV = "etcd-v3" if _etcd_available() else "c10d"


def _launch(
    tmp_path: Path, mode: str, *, rdzv: str = RDZV, nodes: int = 2, nproc: int = 2
) -> TrainLaunch:
    return TrainLaunch(
        run_id=f"test-local-{mode}-{uuid.uuid4().hex[:8]}",
        trainer=_stand_in_config(tmp_path, mode),
        nodes=nodes,
        nproc_per_node=nproc,
        rdzv_backend=rdzv,
        entrypoint=(WORKER,),
    )


def _stand_in_config(tmp_path: Path, mode: str) -> TrainConfig:
    """The stand-in worker reads its behaviour from the model name (`stand-in:<mode>`)."""
    return TrainConfig(
        model=f"stand-in:{mode}",
        data=str(tmp_path / "data"),
        output=str(tmp_path / "out"),
        max_steps=3,
    )


def _assert_nothing_left(launcher: LocalLauncher, run_id: str) -> None:
    assert marked_pids(launcher.marker(run_id)) == []
    assert not launcher.state_dir(run_id).exists()


@pytest.mark.slow
def test_two_nodes_two_procs_succeed(tmp_path: Path) -> None:
    """Through the train step, as the pipeline's component calls it."""
    lines: list[str] = []
    state_root = tmp_path / "state"
    run_id = f"test-local-ok-{uuid.uuid4().hex[:8]}"
    launch = TrainLaunch(
        run_id=run_id,
        trainer=_stand_in_config(tmp_path, "ok"),
        nodes=2,
        nproc_per_node=2,
        rdzv_backend=RDZV,
        entrypoint=(WORKER,),
    )
    metadata = train(launch, LocalOptions(state_root=state_root), log=lines.append)

    # 4 ranks all-reduced 1+2+3+4 through the rendezvous-built process group.
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["sum"] == 10.0
    assert metadata["base_model"] == "stand-in:ok" and metadata["steps"] == 3
    assert metadata["model_uri"] == str(tmp_path / "out" / "model")
    assert (metadata["nodes"], metadata["nproc_per_node"], metadata["rdzv_backend"]) == (2, 2, RDZV)
    # Every worker line carries its node and global rank, in the console and in the node's file.
    for rank in range(4):
        assert any(f"rank{rank}] rank {rank}/4" in line for line in lines), rank
    node1 = (tmp_path / "out" / "logs" / "node1.log").read_text()
    assert f"--rdzv-backend={RDZV}" in node1 and f"--rdzv-id={run_id}" in node1
    assert any(line.startswith("[node1 rank") for line in node1.splitlines())
    _assert_nothing_left(LocalLauncher(LocalOptions(state_root=state_root)), run_id)
    assert not state_root.exists()  # the etcd we started is stopped and its state removed


@pytest.mark.slow
def test_failing_node_stops_the_others_and_is_reported(tmp_path: Path) -> None:
    launcher = LocalLauncher(
        LocalOptions(state_root=tmp_path / "state", grace_s=5), log=lambda line: None
    )
    launch = _launch(tmp_path, "fail")
    result = launcher.run(launch, timeout=240)

    assert result.status == "failed"
    # The last global rank lives on one node; that node's agent fails, the other is stopped.
    assert result.failed_node in (0, 1) and result.exit_code not in (0, None)
    # The survivors sleep for an hour: a node's exit status (not "timed out") as the result means
    # the healthy node was stopped, not waited for.
    assert f"node {result.failed_node} exited with status" in result.message
    assert any("boom: simulated worker failure" in line for line in result.log_tail)
    with pytest.raises(LaunchFailed, match="boom"):
        result.raise_for_status()
    _assert_nothing_left(launcher, launch.run_id)


_SIGTERM_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from components.launchers import TrainLaunch
    from components.launchers.local import LocalLauncher, LocalOptions
    from trainer.config import TrainConfig
    spec = json.loads(sys.argv[1])
    launch = TrainLaunch(
        **spec | {"trainer": TrainConfig.from_json(spec["trainer"]), "entrypoint": tuple(spec["entrypoint"])}
    )
    result = LocalLauncher(LocalOptions(state_root=sys.argv[2], grace_s=5)).run(launch, timeout=300)
    print("RESULT", result.status, result.message, flush=True)
    sys.exit(0 if result.status == "cancelled" else 1)
    """
)


@pytest.mark.slow
def test_sigterm_stops_every_process_of_the_run(tmp_path: Path) -> None:
    launch = _launch(tmp_path, "hang")
    spec = {k: getattr(launch, k) for k in ("run_id", "nodes", "nproc_per_node", "rdzv_backend")}
    spec |= {"trainer": launch.trainer.to_json(), "entrypoint": [WORKER]}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_SCRIPT, json.dumps(spec), str(tmp_path / "state")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    ready: set[str] = set()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "] ready " in line:
                ready.add(line.split("] ready ")[1].strip())
            if len(ready) == 4:
                break
        assert len(ready) == 4, "workers never became ready"
        marker = LocalLauncher(LocalOptions(state_root=tmp_path / "state")).marker(launch.run_id)
        assert len(marked_pids(marker)) >= 6  # 2 agents + 4 workers
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "RESULT cancelled cancelled by SIGTERM" in out
    _assert_nothing_left(LocalLauncher(LocalOptions(state_root=tmp_path / "state")), launch.run_id)


@pytest.mark.slow
def test_cleanup_from_another_launcher_kills_the_run(tmp_path: Path) -> None:
    """What the pipeline's exit handler does: it only knows the run id."""
    state_root = tmp_path / "state"
    ready: list[str] = []
    owner = LocalLauncher(LocalOptions(state_root=state_root, grace_s=5), log=ready.append)
    launch = _launch(tmp_path, "hang", rdzv="c10d", nodes=1, nproc=1)
    owner.start(launch)
    try:
        deadline = time.monotonic() + 120
        while not any("] ready " in line for line in ready):  # the worker says it is up
            assert time.monotonic() < deadline, ready
            time.sleep(0.2)
        assert (state_root / launch.rdzv_id / "launcher.json").exists()
        removed = launcher(LocalOptions(state_root=state_root, grace_s=5)).cleanup(launch.run_id)
        assert any("stopped the processes" in r for r in removed)
        assert marked_pids(owner.marker(launch.run_id)) == []
        # Already gone: a second cleanup finds nothing and does not fail.
        assert launcher(LocalOptions(state_root=state_root)).cleanup(launch.run_id) == []
    finally:
        owner.cancel()
    _assert_nothing_left(owner, launch.run_id)


def test_invalid_launch_lists_every_problem(tmp_path: Path) -> None:
    bad = TrainLaunch(
        run_id=" ",
        trainer=TrainConfig(model="", data="d", output="o", max_steps=0),
        nodes=0,
        rdzv_backend="zk",
        rdzv_endpoint="nohost",
    )
    with pytest.raises(ValueError) as err:
        LocalLauncher(LocalOptions(state_root=tmp_path)).start(bad)
    text = str(err.value)
    for expected in (
        "run id is empty",
        "--model is required",
        "nodes=0",
        "rdzv_backend='zk'",
        "expected host:port",
        "max_steps must be >= 1",
    ):
        assert expected in text
    assert not os.listdir(tmp_path)


def test_cleanup_local_state_clears_stale_runs(tmp_path: Path) -> None:
    """A run whose launcher died hard: its state file points at processes that are gone."""
    from components.steps.cleanup import cleanup_local_state

    state_root = tmp_path / "state"
    stale = state_root / "stale-run"
    stale.mkdir(parents=True)
    (stale / "launcher.json").write_text(
        json.dumps({"run_id": "stale-run", "pgids": [2**22 + 7], "etcd_started": False,
                    "state_dir": str(stale), "log_dir": str(tmp_path)})
    )  # fmt: skip
    removed = cleanup_local_state(state_root)
    assert any("stale-run" in item for item in removed)
    assert not state_root.exists()
    assert cleanup_local_state(state_root) == []
