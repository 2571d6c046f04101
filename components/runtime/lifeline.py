"""Processes that die with the local run that started them, whatever way it ends.

Two mechanisms, for the two shapes of a local run (this module imports nothing of the project,
so launchers and etcd use it freely):
- `die_with_parent()`: a `Popen(preexec_fn=...)` that sets Linux's parent-death signal
  (`prctl(PR_SET_PDEATHSIG, SIGTERM)`) in the child. The launcher's torchrun agents and its own
  etcd get SIGTERM the moment `llmft train` dies, even by SIGKILL; an agent then stops its
  workers. The signal follows the *thread* that started the child: start and follow a run on one
  thread (`Launcher.run` does).
- `pipelines.watchdog.Watchdog`: for `llmft run --backend local`, whose steps are kfp.local's processes and
  grandchildren (no parent-death signal reaches those, and the etcd step's etcd must outlive its
  own task). Every process of the run inherits `RUN_TREE_ENV=<state dir>`; a small detached
  process (`python -m pipelines.watchdog WATCHED_PID STATE_DIR`) waits for the runner's pid to
  end, then stops whatever still carries the marker and cleans the state dir (etcd and its
  data, launcher state), as the runner itself does when it ends normally.

What a dead run left (state files, an etcd data dir) is removed by `llmft cleanup`.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
RUN_TREE_ENV = "LLMFT_LOCAL_RUN"
"""Marks every process of one `llmft run --backend local` (its value: the run's state dir)."""


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` giving the child SIGTERM when its parent (thread) dies; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the forked child

    def preexec() -> None:
        # Between fork and exec only this C call runs (no Python lock is taken). Popen returns
        # after the exec, so the parent is alive when the signal is armed.
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    return preexec


def wait_for_exit(pid: int) -> None:
    """Block until process `pid` (not our child) has ended."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd (Linux < 5.3): poll
        while alive(pid):
            time.sleep(0.5)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def alive(pid: int) -> bool:
    """True if `pid` runs and is not a zombie (a zombie has exited; its parent just hasn't reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc: trust kill(0)
