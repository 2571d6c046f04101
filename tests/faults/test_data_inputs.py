"""Faults, round 2 (issue 36), data: an `--input` that is wrong as a whole.

`llmft preprocess` must refuse it with exit 2 and one `error:` line before anything starts (no
output directory, no Beam pipeline), naming what to give instead. Found and fixed: a directory
given as `--input` started the pipeline and crashed in it (IsADirectoryError, a traceback, exit 1);
a glob that matched a file of unknown format (a README.md) failed only inside the running
pipeline, a traceback in the log; a glob that matched a named pipe would wait on it forever.

Symbolic-link loops under an input directory end neither in a hang nor in a file read twice:
Beam's local listing does not follow links to directories, and a link that leads nowhere (a loop,
a dangling link) is not a file and is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft

from faults.conftest import instruction_rows, preprocess


def _jsonl(path: Path, tag: str, n: int = 10) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in instruction_rows(n, tag)))
    return path


def _no_match(d: Path) -> str:
    _jsonl(d / "train.jsonl", "x")
    return str(d / "trian*.jsonl")  # a typo: matches nothing


def _directory(d: Path) -> str:
    _jsonl(d / "data" / "part-0.jsonl", "x")
    (d / "data" / "part-1.csv").write_text("prompt,response\np,r\n")
    (d / "data" / "_SUCCESS").write_text("")
    return str(d / "data")


def _unknown_format(d: Path) -> str:
    _jsonl(d / "data" / "train.jsonl", "x")
    (d / "data" / "README.md").write_text("# my data\n")
    return str(d / "data" / "*")


def _symlink_loop_as_input(d: Path) -> str:
    os.symlink(d / "b", d / "a")
    os.symlink(d / "a", d / "b")
    return str(d / "a")


CASES: dict[str, tuple[Callable[[Path], str], tuple[str, ...]]] = {
    "glob_matches_nothing": (_no_match, ("--input matches no files", "trian*.jsonl")),
    "directory": (
        _directory,
        ("is a directory", "give the files to read as a glob", "data/*.csv'", "data/'"),
    ),
    "file_of_unknown_format": (_unknown_format, ("README.md", "--input-format")),
    "symlink_loop_as_input": (_symlink_loop_as_input, ("--input matches no files",)),
}


@pytest.mark.unit
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_before_anything_starts(
    name: str, tiny_model_dir: Path, tmp_path: Path
):
    write, fragments = CASES[name]
    pattern = write(tmp_path)
    out = tmp_path / "out"
    result = llmft(
        "preprocess",
        f"--input={pattern}",
        f"--output={out}",
        f"--tokenizer={tiny_model_dir}",
        "--seq-len=512",
    )
    assert_user_error(result, *fragments)
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists()  # nothing started: not even the output directory


@pytest.mark.integration
def test_a_named_pipe_matched_by_the_glob_is_refused_not_waited_on(
    tiny_model_dir: Path, tmp_path: Path
):
    _jsonl(tmp_path / "data" / "train.jsonl", "x")
    os.mkfifo(tmp_path / "data" / "stream.jsonl")  # no writer: reading it would block forever
    out = tmp_path / "out"
    llmft_bin = Path(sys.executable).with_name("llmft")
    command = [
        str(llmft_bin), "preprocess", f"--input={tmp_path / 'data'}/*.jsonl", f"--output={out}",
        f"--tokenizer={tiny_model_dir}", "--seq-len=512",
    ]  # fmt: skip
    # A process with a deadline, so that a regression fails instead of hanging the suite.
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "stream.jsonl" in lines[0] and "not a regular file" in lines[0]
    assert not out.exists()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("pattern", "read"),
    [("root/**", {"a.jsonl": 10, "sub/b.jsonl": 3}), ("root/*.jsonl", {"a.jsonl": 10})],
)
def test_symlink_loops_under_the_input_are_neither_followed_nor_read_twice(
    pattern: str, read: dict[str, int], tiny_model_dir: Path, tmp_path: Path
):
    root = tmp_path / "root"
    _jsonl(root / "a.jsonl", "top")
    _jsonl(root / "sub" / "b.jsonl", "sub", n=3)
    os.symlink(root, root / "self")  # a directory loop: root/self/self/...
    os.symlink(root / "sub", root / "sub" / "up")
    os.symlink(root / "l2.jsonl", root / "l1.jsonl")  # a link loop between two names
    os.symlink(root / "l1.jsonl", root / "l2.jsonl")
    os.symlink(root / "gone.jsonl", root / "dangling.jsonl")

    stats, letters = preprocess([tmp_path / pattern], tmp_path / "out", tiny_model_dir)

    assert stats["records_read"] == sum(read.values())
    assert stats["kept"] == sum(read.values()) and not letters
    assert stats["duplicates"] == 0  # no file was read twice through a link
