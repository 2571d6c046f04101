"""Faults: Ctrl-C, and two runs into one output at once (issue 36, training).

Ctrl-C of `llmft preprocess` printed Beam's traceback of the step it stopped; two `llmft
preprocess` or two `llmft train` into one output both ran, writing (and, with --overwrite,
deleting) the same files; work directories of a killed preprocessing run (`.temp-*`, `.shuffle-*`)
made the output "not empty" for good. Now a local output is held by one run at a time (a kernel
lock: a killed run never leaves a stale one), the second run is refused with exit 2 and one
`error:` line, Ctrl-C stops a run with one `error:` line and nothing left running, the same
command reruns at once, and an interrupted run's work directories are removed by the next run.

Waits on explicit signals: preprocessing reads a named pipe, so it is blocked in its read step
once the pipe has a reader; the trainer pauses after step 1 and says so with a file
(tests/trainer_pause).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft
from test_pipeline_local import _as_a_foreground_job
from trainer_pause.sitecustomize import pause_env

from faults.conftest import instruction_rows, preprocess, wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _start(started: list[subprocess.Popen], args: list[str], env: dict | None = None):
    """`llmft ARGS` as a terminal's foreground job: its own process group, Ctrl-C not ignored."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=REPO,
        env=env or {**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_as_a_foreground_job,
    )
    started.append(proc)
    return proc


def _ctrl_c(proc: subprocess.Popen) -> tuple[int, str]:
    """SIGINT to the process group, as a terminal sends it; (exit code, output)."""
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=300)
    return proc.returncode, output


def _group_gone(proc: subprocess.Popen) -> bool:
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return True
    return False


def _open_writer(fifo: Path, reader: subprocess.Popen) -> int | None:
    """The pipe's write end once a reader has opened it (None while none has)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        assert exc.errno == errno.ENXIO, exc
        assert reader.poll() is None, reader.communicate()[0][-3000:]
        return None


RECORDS = "".join(json.dumps(r) + "\n" for r in instruction_rows(40, "pipe")).encode()


def test_preprocess_ctrl_c_and_a_second_run_into_the_same_output(
    started, tiny_model_dir: Path, tmp_path: Path
):
    fifo, out = tmp_path / "records.jsonl", tmp_path / "dataset"
    os.mkfifo(fifo)
    args = ["preprocess", f"--input={fifo}", f"--output={out}", f"--tokenizer={tiny_model_dir}",
            "--seq-len=64"]  # fmt: skip
    first = _start(started, args)
    writer = wait_for(lambda: _open_writer(fifo, first), "preprocessing to read its input")
    try:
        os.write(writer, RECORDS[: len(RECORDS) // 2])  # some records; the pipe stays open

        # A second run into the same output while the first reads: refused, the first unharmed.
        second = llmft(*args)
        assert_user_error(second, f"{str(out)!r} is in use by another run", "llmft preprocess")
        assert second.output.count("error:") == 1, second.output
        assert first.poll() is None

        code, output = _ctrl_c(first)
    finally:
        os.close(writer)
    assert code == 130, output[-3000:]
    assert "Traceback" not in output and "ERROR" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "interrupted (Ctrl-C)" in errors[0], errors
    assert _group_gone(first)
    assert not out.exists()  # nothing was written: no lock, no work directory, no empty dir

    # The same command, at once: runs to the end.
    rerun = _start(started, args)
    writer = wait_for(lambda: _open_writer(fifo, rerun), "the rerun to read its input")
    os.write(writer, RECORDS)
    os.close(writer)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    assert json.loads((out / "manifest.json").read_text())["stats"]["records_read"] == 40


@pytest.mark.slow
def test_work_dirs_of_a_killed_preprocess_run_do_not_block_a_rerun(
    tiny_model_dir: Path, tmp_path: Path
):
    """What SIGKILL leaves (no `finally` ran): the work directories of the run. The next run,
    holding the output's lock, removes them, with or without --overwrite; a user's own hidden
    directory is never taken for one of them."""
    records = tmp_path / "train.jsonl"
    records.write_bytes(RECORDS)
    out = tmp_path / "dataset"
    for work in (".temp-0123456789ab", ".shuffle-k2x_9a0q"):
        (out / work).mkdir(parents=True)
        (out / work / "part.parquet").write_bytes(b"half a file")
    preprocess([records], out, tiny_model_dir)  # the same command again: no --overwrite needed
    assert not list(out.glob(".temp-*")) and not list(out.glob(".shuffle-*"))

    (out / ".temp-0123456789ab").mkdir()  # killed again, during a run with --overwrite
    preprocess([records], out, tiny_model_dir, "--overwrite")
    assert not list(out.glob(".temp-*"))

    (out / ".temp-mine").mkdir()  # not a run's work directory: the user's, so refused
    (out / ".temp-mine" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"\.temp-mine"):
        preprocess([records], out, tiny_model_dir, "--overwrite")
    assert (out / ".temp-mine").is_dir()


@pytest.mark.slow
def test_train_a_second_run_is_refused_then_ctrl_c_then_the_same_command_resumes(
    started, tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    from components.launchers.run_processes import marked_pids
    from components.runtime.lifeline import alive
    from components.runtime.run_identity import run_state_dir

    out, ready = tmp_path / "run", tmp_path / "ready"
    ready.mkdir()
    args = ["train", "--model", str(tiny_model_dir), "--data", str(small_dataset),
            "--output", str(out), "--max-steps", "3", "--nodes", "1", "--run-id", "ctrl-c-run",
            "--set", "log_every=1", "--set", "tensorboard=false"]  # fmt: skip
    first = _start(started, args, env=pause_env(1, str(ready)))
    wait_for(lambda: (ready / "paused.rank0").exists() or first.poll() is not None, "step 1")
    assert first.poll() is None, first.communicate()[0][-3000:]
    state = run_state_dir("ctrl-c-run")
    etcd = json.loads((state / "etcd.json").read_text())
    run_processes = [*marked_pids(str(state)), etcd["pid"]]
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))

    # A second run into the same output: refused before it reads, deletes or starts anything.
    second = llmft(*args, "--overwrite", "--run-id", "intruder")
    assert_user_error(second, f"{str(out)!r} is in use by another run", "llmft train")
    assert second.output.count("error:") == 1, second.output
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    assert first.poll() is None

    code, output = _ctrl_c(first)
    assert code == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cancelled by SIGINT" in errors[0], errors
    wait_for(lambda: not any(alive(pid) for pid in run_processes), "the run's processes to end")
    assert not state.exists() and not Path(etcd["data_dir"]).exists()
    assert not (out / ".llmft.lock").exists()

    # The same command, at once: it runs to the end (resuming if the SIGTERM save made it).
    rerun = _start(started, args)
    output, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, output[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
