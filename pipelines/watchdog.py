"""The watchdog of a local pipeline run (`llmft run --backend local`): when the runner's process
ends, however it ends (SIGKILL included), stop every process of the run and clean its local state.

Why a process of its own: the run's steps are kfp.local's processes and their children, which no
parent-death signal reaches, and the etcd step's etcd must outlive its own task
(components/runtime/lifeline.py has the other mechanism and the whole picture). Every process of the run
inherits `RUN_TREE_ENV=<state dir>`; this process waits for the runner's pid to end, then SIGTERMs
whatever still carries the marker, SIGKILLs what is left after `GRACE_S`, and cleans the state
dir (etcd and its data, launcher state), as the runner does itself when it ends normally.

Run by the runner: `python -m pipelines.watchdog WATCHED_PID STATE_DIR`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from components.launchers.run_processes import marked_pids, terminate_run_processes
from components.runtime.lifeline import RUN_TREE_ENV, wait_for_exit
from components.steps.cleanup import cleanup_local_state

GRACE_S = 15.0
"""How long the run's processes get to stop after SIGTERM before SIGKILL."""


class Watchdog:
    """A detached process that cleans up the run under `state_dir` once `pid` has ended.

    Start it before the run's first process (they must inherit `RUN_TREE_ENV`, which `start`
    sets in this process's environment); `stop()` it once the run was cleaned up normally.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        log_file: str | os.PathLike[str],
        pid: int | None = None,
    ) -> None:
        self.state_dir, self.log_file = str(state_dir), Path(log_file)
        self.pid = os.getpid() if pid is None else pid
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != RUN_TREE_ENV}
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(self.pid), self.state_dir],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C or hang-up must not reach it
            )
        os.environ[RUN_TREE_ENV] = self.state_dir

    def stop(self) -> None:
        """The run ended and was cleaned up by its runner: the watchdog is not needed."""
        os.environ.pop(RUN_TREE_ENV, None)
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()
            self._proc.wait()
            self._proc = None


def stop_run_tree(state_dir: str, *, grace_s: float = GRACE_S) -> list[str]:
    """Stop every process marked with `state_dir` (SIGTERM, then SIGKILL after `grace_s`), then
    clean the run's local state (etcd and its data, launcher state). Returns what was done."""
    done = []
    marked = marked_pids(state_dir, env=RUN_TREE_ENV)
    if marked:
        for pid in marked:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        killed = terminate_run_processes(state_dir, [], grace_s=grace_s, env=RUN_TREE_ENV)
        done.append(f"stopped {len(marked)} process(es) of the run ({killed} needed SIGKILL)")
    return done + cleanup_local_state(state_dir)


def main(argv: list[str]) -> int:
    """`python -m pipelines.watchdog WATCHED_PID STATE_DIR`: the watchdog process."""
    pid, state_dir = int(argv[0]), argv[1]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `Watchdog.stop`: nothing to do
    wait_for_exit(pid)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # from here on, finish the cleanup
    for line in stop_run_tree(state_dir):
        print(f"[watchdog] process {pid} ended: {line}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
