"""Secrets (issue 36, round 2): a Hugging Face token given through the environment (HF_TOKEN,
HUGGING_FACE_HUB_TOKEN) or typed into a parameter by mistake never appears in what a local run
prints or writes: preprocess, train (torchrun agents, ranks, etcd), evaluate, `llmft run
--dry-run`, and the error messages that quote what was typed.

The check is a byte search of the captured output of every command and of every file under the
test's directory and the local run state root, so a new log, report or artifact is covered
without being named here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from faults.conftest import error_lines, llmft_process
from pipelines.cli import app

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "hf_" + "Zq7sEcReTtOkEn" * 3  # token-shaped: hf_ and 42 letters
TOKEN_ENV = {"HF_TOKEN": TOKEN, "HUGGING_FACE_HUB_TOKEN": TOKEN}


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


def test_a_token_never_reaches_logs_outputs_or_reports(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
):
    records = tmp_path / "records.jsonl"
    lines = (sample_data_dir / "train.jsonl").read_text().splitlines()[:300]
    records.write_text("\n".join(lines) + "\n")
    data, run, report = tmp_path / "data", tmp_path / "run", tmp_path / "report"
    outputs = []

    def step(*args: str, code: int = 0) -> str:
        result = llmft_process(*args, env=TOKEN_ENV)
        assert result.returncode == code, result.output
        outputs.append(result.output)
        return result.output

    def checked(*args: str, code: int) -> str:
        """A dry run or a refusal: in this process (what it prints is the same; no child
        interpreter needed to start nothing)."""
        result = CliRunner().invoke(app, list(args), env=TOKEN_ENV)
        assert result.exit_code == code, result.output
        outputs.append(result.output)
        return result.output

    step(
        "preprocess", f"--input={records}", f"--output={data}",
        f"--tokenizer={tiny_model_dir}", "--seq-len=128",
    )  # fmt: skip
    # One node: an agent, a rank and etcd, every kind of process two nodes start.
    step(
        "train", "--model", str(tiny_model_dir), "--data", str(data), "--output", str(run),
        "--max-steps", "2", "--rdzv-backend", "etcd-v3", "--nodes", "1",
    )  # fmt: skip
    step(
        "evaluate", "--base", str(tiny_model_dir), "--tuned", str(run / "model"),
        "--data", str(data), "--output", str(report), "--max-examples", "2",
    )  # fmt: skip
    checked(
        "run", "--backend", "local", "--dry-run", "--param", f"workdir={tmp_path / 'w'}", code=0
    )

    # Typed into a parameter by mistake: refused, and the refusal does not quote it.
    for args in (
        ["run", "--backend", "local", "--dry-run", "--param", f"hf_token_secret={TOKEN}"],
        ["run", "--backend", "local", "--dry-run", "--param", f"seq_len={TOKEN}"],
        ["run", "--backend", "local", "--dry-run", "--param", f"trainer_overrides={json.dumps({'x': TOKEN})}"],
        ["train", "--model", str(tiny_model_dir), "--data", str(data), "--output",
         str(tmp_path / "typo"), "--set", f"learning_rate={TOKEN}"],
    ):  # fmt: skip
        output = checked(*args, code=2)
        assert len(error_lines(output)) == 1, output

    assert (report / "metrics.json").exists() and (run / "model" / "config.json").exists()
    for output in outputs:
        assert TOKEN not in output
    assert _files_holding(tmp_path, TOKEN.encode()) == []
    state_root = Path(os.environ["LLMFT_STATE_DIR"])
    if state_root.exists():
        assert _files_holding(state_root, TOKEN.encode()) == []
