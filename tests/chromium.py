"""Headless Chromium for the tests that render an HTML page (the evaluation report, a schedule's
history): Debian's `chromium`, run so that a hang kills its whole process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


def run_chromium(args: list[str], profile: Path, timeout: float = 120) -> str:
    """Run headless Chromium; kill its whole process group if it hangs (no leftover processes)."""
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={profile}", *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0 or out, f"chromium failed with {proc.returncode}"
    return out
