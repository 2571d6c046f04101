"""Fault: an --output that breaks only at the end, or that eats a user's files (issue 37, sixth
bullet).

`llmft preprocess --output 'out[1]'` did all the work and then crashed in the final commit (Beam
matches and deletes by pattern), leaving a partial dataset; it is now refused before anything
starts. `llmft evaluate --output DIR` silently replaced a user's own report.html or metrics.json
there; it now refuses, unless --overwrite, files that no llmft evaluation wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft

pytestmark = pytest.mark.unit


def test_preprocess_refuses_glob_characters_in_output_before_starting(
    tiny_model_dir: Path, tmp_path: Path
):
    records = tmp_path / "train.jsonl"
    records.write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n")
    out = tmp_path / "out[1]"
    result = llmft(
        "preprocess",
        f"--input={records}",
        f"--output={out}",
        f"--tokenizer={tiny_model_dir}",
        "--seq-len=512",
    )
    assert_user_error(result, "out[1]", "glob character")
    assert not out.exists()


def test_evaluate_refuses_to_replace_a_users_files(tiny_model_dir: Path, tmp_path: Path):
    from components.evaluation.outputs import check_output_dir

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.html").write_text("<p>my own report</p>")
    result = llmft(
        "evaluate",
        f"--base={tiny_model_dir}",
        f"--tuned={tiny_model_dir}",
        f"--data={tmp_path / 'no-dataset-needed-to-refuse'}",
        f"--output={mine}",
    )
    assert_user_error(result, "report.html", "--overwrite")
    assert (mine / "report.html").read_text() == "<p>my own report</p>"

    check_output_dir(str(mine), overwrite=True)  # the way out
    check_output_dir(str(tmp_path / "new"), overwrite=False)  # nothing there yet
    rerun = tmp_path / "rerun"  # an earlier evaluation's files are replaced
    rerun.mkdir()
    (rerun / "metrics.json").write_text(
        json.dumps({"metrics": {}, "passed": True, "checks": [], "models": {}, "settings": {}})
    )
    (rerun / "report.html").write_text("<p>llmft</p>")
    check_output_dir(str(rerun), overwrite=False)
