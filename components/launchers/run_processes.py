"""The processes of a local run, found by a marker every one of them inherits.

torchrun starts its workers in sessions of their own, so a group kill misses them if an agent dies
hard; every process of a run therefore carries `LLMFT_LAUNCHER_RUN=<marker>` in its environment,
and the last resort is to SIGKILL whatever in /proc carries it (components/launchers/local.py).
The marker is the run's state directory, not its id: two runs with the same id under different
state roots (two users, two test sessions) must never stop each other's processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

MARKER_ENV = "LLMFT_LAUNCHER_RUN"
"""Environment variable that marks every process of a local run (inherited by torchrun workers)."""


def marked_pids(marker: str, *, env: str = MARKER_ENV) -> list[int]:
    """Pids of live processes carrying this run's marker in variable `env` (Linux /proc; empty
    elsewhere)."""
    needle = f"{env}={marker}".encode()
    pids = []
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            # Zombies keep their environ until reaped; they are already dead.
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def _kill_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def terminate_run_processes(
    marker: str, pgids: Iterable[int], *, grace_s: float, env: str = MARKER_ENV
) -> int:
    """SIGTERM the agents' process groups (torchrun then stops its workers cleanly), wait up to
    `grace_s`, then SIGKILL every process still carrying the run's marker (in variable `env`).
    Returns how many processes had to be killed."""
    # Only groups whose leader still carries the marker: a recorded pid may have been reused.
    live = set(marked_pids(marker, env=env))
    pgids = [pgid for pgid in pgids if pgid in live]
    for pgid in pgids:
        _kill_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and marked_pids(marker, env=env):
        time.sleep(0.1)
    leftovers = marked_pids(marker, env=env)
    for pid in leftovers:
        _kill(pid, signal.SIGKILL)
    for pgid in pgids:
        _kill_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and marked_pids(marker, env=env):
        time.sleep(0.05)
    return len(leftovers)
