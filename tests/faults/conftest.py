"""What the fault tests share: a preprocessing run over hand-made inputs, and a small packed
dataset, both built on the session fixtures of tests/conftest.py (`tiny_model_dir`,
`sample_data_dir`); and waiting on explicit signals (a file, a process's end) with a failsafe
deadline only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

FAILSAFE_S = 180.0
"""How long a wait for a signal may take before the test fails (never a pause: waits poll)."""


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts; whatever is left is killed at the end, with its process group
    when it leads one (a command started as a terminal's foreground job)."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # not a group leader
                proc.kill()
        proc.wait()


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = FAILSAFE_S) -> Any:
    """Poll `condition` until it returns something truthy; fail with `what` after the failsafe."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)  # polling a condition, not waiting for time to pass
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")


def preprocess(
    inputs: list[Path], out: Path, tokenizer: Path, *extra: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the real Beam pipeline on `inputs`; return its stats and its dead letters."""
    from beam_preprocess.pipeline import run
    from trainer.packed_data.format import STATS_FILE

    argv = [
        *(f"--input={path}" for path in inputs),
        f"--output={out}",
        f"--tokenizer={tokenizer}",
        "--seq-len=512",
        "--direct_num_workers=1",
        *extra,
    ]
    run(argv)
    stats = json.loads((out / STATS_FILE).read_text())
    letters = [
        json.loads(line)
        for shard in sorted((out / "rejected").glob("*.jsonl"))
        for line in shard.read_text().splitlines()
    ]
    return stats, letters


def instruction_rows(n: int, tag: str) -> list[dict[str, str]]:
    """`n` distinct prompt/response records (distinct, so that dedup keeps them all)."""
    return [
        {"prompt": f"{tag} question {i}: what is {i} plus {i}?", "response": f"It is {2 * i}."}
        for i in range(n)
    ]


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A small packed dataset (seq_len 64) made with the tiny model's tokenizer."""
    from packed_fixtures import write_packed_dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    records = instruction_rows(48, "small")
    out = tmp_path_factory.mktemp("fault_dataset")
    write_packed_dataset(out, tokenizer, {"train": records[:40], "eval": records[40:]}, seq_len=64)
    return out


def _mount_tmpfs(where: Path, options: str) -> str | None:
    """Mount a tmpfs at `where`; the reason it cannot be done here, or None when it is mounted."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "mounting a tmpfs needs root (CAP_SYS_ADMIN); these tests run as another user"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if done.returncode == 0 else f"mount -t tmpfs failed here: {done.stderr.strip()}"


def _unmount(where: Path) -> None:
    import subprocess

    subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


class SmallDisk:
    """A real, small file system (tmpfs) mounted for one test: writes past its size fail with
    ENOSPC in the kernel, as on a full disk. `grow` makes room (remount) to show a resume."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def grow(self, size: str) -> None:
        import subprocess

        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.root)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path):
    """`small_disk(size)` -> SmallDisk mounted under tmp_path (unmounted at the end); skips,
    with the reason, where no tmpfs can be mounted."""
    mounted: list[Path] = []

    def make(size: str) -> SmallDisk:
        where = tmp_path / f"disk{len(mounted)}"
        reason = _mount_tmpfs(where, f"size={size}")
        if reason:
            pytest.skip(reason)
        mounted.append(where)
        return SmallDisk(where)

    yield make
    for where in mounted:
        _unmount(where)


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """A directory nobody may write into, root included: chmod 0555 for a normal user; for root
    (whom chmod does not stop) a read-only tmpfs. Skips, with the reason, if neither works."""
    where = tmp_path / "read_only"
    where.mkdir()
    if os.geteuid() != 0:
        where.chmod(0o555)
        yield where
        where.chmod(0o755)
        return
    reason = _mount_tmpfs(where, "ro,size=1m")
    if reason:
        pytest.skip(reason)
    yield where
    _unmount(where)


def error_lines(output: str) -> list[str]:
    """The lines of a command's output that start with `error:`."""
    return [line for line in output.splitlines() if line.startswith("error:")]


def llmft_process(*args: str, env: dict[str, str] | None = None, timeout_s: float = 600.0) -> Any:
    """`llmft ARGS` as the user runs it: a process of its own, stdout and stderr together in
    `.output` (what a terminal shows, Beam's and torchrun's lines included)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(repo), full_env.get("PYTHONPATH", "")) if p
    )
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        timeout=timeout_s,
        check=False,
    )
    done.output = done.stdout
    return done


DCP_METADATA = ".metadata"
"""The one dot-file a finished run holds: a DCP checkpoint's index."""


def hidden_entries(root: Path) -> list[Path]:
    """Files and directories under `root` whose names start with a dot, DCP's index aside:
    left-behind state (a `.model.partial` copy, a `.shuffle-*` spill directory)."""
    return [path for path in root.rglob(".*") if path.name != DCP_METADATA]
