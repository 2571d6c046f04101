"""Fault: an output that points at the base model's own directory (issue 36, training).

`llmft train --output` over the base model is round 1's (test_resume_mismatch.py). Preprocessing
into the tokenizer's (= the model's) directory is refused before anything starts, also with
--overwrite (the model's files are not a dataset's, so they are never deleted), and the output's
lock leaves nothing behind in that directory.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft

pytestmark = pytest.mark.unit


def _digest(directory: Path) -> tuple[list[str], str]:
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    names = [str(p.relative_to(directory)) for p in files]
    return names, hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
def test_preprocess_into_the_tokenizer_directory_is_refused(
    tiny_model_dir: Path, tmp_path: Path, extra: list[str]
):
    records = tmp_path / "train.jsonl"
    records.write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n")
    before = _digest(tiny_model_dir)
    result = llmft(
        "preprocess", f"--input={records}", f"--output={tiny_model_dir}",
        f"--tokenizer={tiny_model_dir}", "--seq-len=64", *extra,
    )  # fmt: skip
    expected = "holds files that no finished llmft preprocess run listed" if extra else "not empty"
    assert_user_error(result, str(tiny_model_dir), expected)
    assert result.output.count("error:") == 1, result.output
    assert _digest(tiny_model_dir) == before  # no file deleted, changed or added (no lock left)
