"""Faults of the machine a run is on (issue 36, round 2, "Environment").

An output that cannot be written, an output the inputs would read back, a full disk while
preprocessing, checkpointing and exporting, a TMPDIR that does not exist, no etcd binary. Each is
either refused before anything starts (exit 2, one `error:` line, nothing created) or stops the
run cleanly (exit 1, one `error:` line naming the disk, no traceback, no output that looks
complete, the previous checkpoint kept) and then resumes once there is room.

The disk is real: a small tmpfs mounted for the test (root only; skipped with the reason
elsewhere). Writes past its size fail in the kernel with ENOSPC, as on a full disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft

from faults.conftest import error_lines, hidden_entries, llmft_process

pytestmark = pytest.mark.integration


def _one_error(result, *fragments: str, code: int = 2) -> str:
    """The command failed with `code` and exactly one `error:` line, whose message (with the
    `  - ` items that follow it when several problems are listed) holds `fragments`."""
    output = result.output
    exit_code = getattr(result, "exit_code", getattr(result, "returncode", None))
    assert exit_code == code, output
    assert "Traceback" not in output, output
    lines = error_lines(output)
    assert len(lines) == 1, output
    message = output[output.index(lines[0]) :]
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# -- an output that cannot be written: refused before anything starts ----------------------------


def _commands(out: Path, model: Path, data: Path, records: Path) -> dict[str, list[str]]:
    return {
        "preprocess": [
            "preprocess", f"--input={records}", f"--output={out}", f"--tokenizer={model}",
            "--seq-len=64",
        ],
        "train": [
            "train", "--model", str(model), "--data", str(data), "--output", str(out),
            "--max-steps", "1", "--rdzv-backend", "c10d",
        ],
        "evaluate": [
            "evaluate", "--base", str(model), "--tuned", str(model), "--data", str(data),
            "--output", str(out),
        ],
        "run": ["run", "--backend", "local", "--param", f"workdir={out}"],
    }  # fmt: skip


@pytest.mark.parametrize("command", ["preprocess", "train", "evaluate", "run"])
@pytest.mark.parametrize("where", ["read-only", "under a file"])
def test_unwritable_output_is_refused_before_anything_starts(
    command: str,
    where: str,
    read_only_dir: Path,
    tiny_model_dir: Path,
    small_dataset: Path,
    tmp_path: Path,
):
    records = tmp_path / "train.jsonl"
    records.write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n")
    if where == "read-only":
        out, named = read_only_dir / "out", str(read_only_dir)
    else:
        a_file = tmp_path / "a_file"
        a_file.write_text("mine\n")
        out, named = a_file / "out", f"{a_file} is a file"
    argv = _commands(out, tiny_model_dir, small_dataset, records)[command]
    _one_error(llmft(*argv), named)
    assert not out.exists()
    if where == "under a file":
        assert (tmp_path / "a_file").read_text() == "mine\n"


def test_workdir_that_is_a_file_is_refused(tmp_path: Path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    for dry_run in ([], ["--dry-run"]):
        result = llmft("run", "--backend", "local", "--param", f"workdir={a_file}", *dry_run)
        _one_error(result, "is a file")
    assert a_file.read_text() == "mine\n"


# -- an output that the inputs read back ---------------------------------------------------------


def test_preprocess_output_inside_the_inputs_pattern_is_refused(
    tiny_model_dir: Path, tmp_path: Path
):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n")
    for pattern, out in (
        (f"{data}/**", data / "packed"),  # a rerun would read packed/**.jsonl back as records
        (f"{data}/*.jsonl", data),  # the output is the input's folder
        (str(data / "train.jsonl"), data),
    ):
        result = llmft(
            "preprocess", f"--input={pattern}", f"--output={out}",
            f"--tokenizer={tiny_model_dir}", "--seq-len=64",
        )  # fmt: skip
        _one_error(result, "overlaps --input", "read its own output back")
    assert sorted(p.name for p in data.iterdir()) == ["train.jsonl"]


def test_preprocess_output_beside_the_inputs_is_fine():
    from beam_preprocess.output_dir import check_output_apart_from_inputs

    # `data/*.jsonl` cannot reach data/packed/...: allowed (the usual layout).
    check_output_apart_from_inputs("/d/packed", ["/d/*.jsonl"])
    check_output_apart_from_inputs("/d/packed", ["/d/train.jsonl", "hf://datasets/o/n"])
    with pytest.raises(ValueError, match="overlaps"):
        check_output_apart_from_inputs("/d/packed", ["/d/**/*.jsonl"])


# -- a full disk ---------------------------------------------------------------------------------


def test_full_disk_while_preprocessing_stops_cleanly(
    small_disk, sample_data_dir: Path, tiny_model_dir: Path
):
    disk = small_disk("256k")
    out = disk.root / "dataset"
    result = llmft_process(
        "preprocess", f"--input={sample_data_dir / 'train.jsonl'}", f"--output={out}",
        f"--tokenizer={tiny_model_dir}", "--seq-len=128",
    )  # fmt: skip
    _one_error(result, "no space left", f"the disk mounted at {disk.root}", code=1)
    assert not (out / "manifest.json").exists()  # nothing that looks like a finished dataset
    assert hidden_entries(disk.root) == []  # the spill directory is gone too


def _model_bytes(model: Path) -> int:
    return sum(p.stat().st_size for p in model.glob("*.safetensors"))


def _train(model: Path, data: Path, out: Path, *extra: str, run_id: str):
    return llmft_process(
        "train", "--model", str(model), "--data", str(data), "--output", str(out),
        "--rdzv-backend", "c10d", "--run-id", run_id, *extra,
    )  # fmt: skip


def _nothing_left_running(run_id: str) -> None:
    """No process of the run is alive and its local state is gone."""
    from components.launchers.run_processes import marked_pids
    from components.runtime.run_identity import run_state_dir

    state = run_state_dir(run_id)
    assert marked_pids(str(state)) == []
    assert not state.exists()


@pytest.mark.slow
def test_full_disk_at_a_checkpoint_keeps_the_previous_one_and_resumes(
    small_disk, tiny_model_dir: Path, small_dataset: Path
):
    weights = _model_bytes(tiny_model_dir)
    # A checkpoint is ~3x the weights (fp32 weights + two Adam moments): one fits, two do not.
    disk = small_disk(str(int(4.5 * weights)))
    out = disk.root / "run"
    args = ("--max-steps", "2", "--set", "checkpoint_every=1")
    result = _train(tiny_model_dir, small_dataset, out, *args, run_id="disk-full-checkpoint")
    _one_error(result, "no space left for checkpoint", str(disk.root), code=1)
    _nothing_left_running("disk-full-checkpoint")
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-00000001"]  # kept, and no half-written step 2
    assert (out / "checkpoints" / "step-00000001" / "COMPLETE").exists()
    assert not (out / "model").exists() and not (out / "summary.json").exists()
    assert hidden_entries(disk.root) == []

    disk.grow(str(12 * weights))
    result = _train(tiny_model_dir, small_dataset, out, *args, run_id="disk-full-checkpoint-2")
    assert result.returncode == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["resumed_from_step"], summary["steps"]) == (1, 2)


@pytest.mark.slow
def test_full_disk_at_export_leaves_no_model_and_resumes(
    small_disk, tiny_model_dir: Path, small_dataset: Path
):
    weights = _model_bytes(tiny_model_dir)
    # The final checkpoint (~3x the weights) fits; the exported model (1x) then does not.
    disk = small_disk(str(int(3.5 * weights)))
    out = disk.root / "run"
    result = _train(tiny_model_dir, small_dataset, out, "--max-steps", "1", run_id="disk-full-x")
    _one_error(result, "no space left", f"while writing {out / 'model'}", code=1)
    _nothing_left_running("disk-full-x")
    assert not (out / "model").exists()  # no half-copied model that looks complete
    assert not (out / "summary.json").exists()
    assert (out / "checkpoints" / "step-00000001" / "COMPLETE").exists()
    assert hidden_entries(disk.root) == []  # no .model.partial left behind

    disk.grow(str(8 * weights))
    result = _train(tiny_model_dir, small_dataset, out, "--max-steps", "1", run_id="disk-full-x2")
    assert result.returncode == 0, result.output
    assert json.loads((out / "summary.json").read_text())["resumed_from_step"] == 1
    assert (out / "model" / "config.json").exists()


def test_disk_error_reads_full_disks_from_wrapped_errors(tmp_path: Path):
    import errno

    from trainer import storage

    beam = RuntimeError("OSError: [Errno 28] No space left on device [while running 'Encode']")
    rust = Exception("I/O error: No space left on device (os error 28)")
    for exc in (OSError(errno.ENOSPC, "No space left on device"), beam, rust):
        error = storage.disk_error(exc, str(tmp_path / "out"))
        assert error is not None and "no space left on the disk mounted at" in str(error)
    assert storage.disk_error(OSError(errno.EIO, "I/O error"), str(tmp_path)) is None
    assert storage.disk_error(ValueError("bad value"), str(tmp_path)) is None


# -- TMPDIR, etcd --------------------------------------------------------------------------------


def test_missing_tmpdir_is_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model_dir: Path, small_dataset: Path
):
    missing = tmp_path / "no-such-tmp"
    monkeypatch.setenv("TMPDIR", str(missing))
    out = tmp_path / "run"
    result = llmft(
        "train", "--model", str(tiny_model_dir), "--data", str(small_dataset),
        "--output", str(out), "--max-steps", "1",
    )  # fmt: skip
    _one_error(result, f"TMPDIR={str(missing)!r} does not exist", "mkdir -p")
    assert not out.exists() and not missing.exists()


@pytest.mark.parametrize("module", ["trainer", "beam_preprocess"])
def test_missing_tmpdir_is_refused_by_the_module_entry_points(
    module: str, tmp_path: Path, tiny_model_dir: Path, small_dataset: Path, sample_data_dir: Path
):
    """`python -m trainer` (what torchrun starts) and `python -m beam_preprocess` (what the
    components run) check TMPDIR as `llmft` does."""
    import os
    import subprocess
    import sys

    missing = tmp_path / "no-such-tmp"
    out = tmp_path / "out"
    args = {
        "trainer": ["--model", str(tiny_model_dir), "--data", str(small_dataset)],
        "beam_preprocess": [
            f"--input={sample_data_dir / 'train.jsonl'}",
            f"--tokenizer={tiny_model_dir}",
        ],
    }[module]
    output = ["--output", str(out)] if module == "trainer" else [f"--output={out}"]
    result = subprocess.run(
        [sys.executable, "-m", module, *args, *output],
        capture_output=True, text=True, cwd=Path(__file__).parents[2],
        env={**os.environ, "TMPDIR": str(missing)}, timeout=120,
    )  # fmt: skip
    result.output = result.stdout + result.stderr  # type: ignore[attr-defined]
    _one_error(result, f"TMPDIR={str(missing)!r} does not exist", "mkdir -p")
    assert not out.exists() and not missing.exists()


@pytest.fixture
def path_without_etcd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PATH holding only an empty directory: no etcd (Python itself is run by its full path)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def test_no_etcd_binary_is_refused_before_anything_starts(
    path_without_etcd: None, tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    out = tmp_path / "run"
    result = llmft(
        "train", "--model", str(tiny_model_dir), "--data", str(small_dataset),
        "--output", str(out), "--max-steps", "1", "--rdzv-backend", "etcd-v3",
    )  # fmt: skip
    _one_error(result, "no `etcd` binary on PATH", "apt-get install etcd-server", "c10d")
    assert not out.exists()  # not even the logs directory

    result = llmft("run", "--backend", "local", "--param", f"workdir={tmp_path / 'w'}")
    assert_user_error(result, "etcd-server", "rdzv_backend=c10d")
    assert not (tmp_path / "w").exists()
