"""`llmft history --html` in a real headless Chromium: the curves are drawn (issue 48)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"


def _chromium(args: list[str], profile: Path, timeout: float = 120) -> str:
    """Headless Chromium; its whole process group is killed if it hangs."""
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


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")
def test_history_page_draws_its_curves_in_chromium(tmp_path: Path) -> None:
    import numpy as np
    from matplotlib.image import imread
    from test_schedules import _three_runs
    from typer.testing import CliRunner

    from pipelines.cli import app

    work_uri, _ = _three_runs(tmp_path)
    page = tmp_path / "history.html"
    result = CliRunner().invoke(app, ["history", work_uri, "--html", str(page)])
    assert result.exit_code == 0, result.output
    dom = _chromium(["--dump-dom", page.as_uri()], tmp_path / "profile-dom")
    assert dom.count('<figure data-curve="') == 4
    assert "skipped: nothing new" in dom and "refused (forgetting)" in dom
    shot = tmp_path / "history.png"
    _chromium(
        [f"--screenshot={shot}", "--window-size=1000,900", "--hide-scrollbars", page.as_uri()],
        tmp_path / "profile-shot",
    )
    pixels = imread(str(shot))[..., :3]
    blue = np.array([0x1F, 0x6F, 0xEB]) / 255  # the curves' stroke and dots
    drawn = int((np.abs(pixels - blue).max(axis=-1) < 0.08).sum())
    assert drawn > 300, f"only {drawn} curve pixels in the screenshot"
