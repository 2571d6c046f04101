"""Faults: `llmft sample-data` and `llmft tiny-model` refusals leave nothing behind (issue 51).

`llmft sample-data OUT --heldout 2000` created OUT, then refused (the `multiply` task has 784
distinct prompts; the training split had used most of them): a refusal must create nothing.
`llmft tiny-model OUT --hidden-size 3` ended in a transformers traceback after training a
tokenizer; `--layers 0` wrote a model with no layers, `--vocab-size 1` silently gave 261 tokens and
`--data DIR` without a train.jsonl was ignored for the built-in records.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft

pytestmark = pytest.mark.unit


def test_sample_data_refusal_creates_nothing(tmp_path: Path):
    out = tmp_path / "data"
    result = llmft("sample-data", str(out), "--heldout", "2000")
    assert_user_error(result, "cannot generate 2000 unique prompts", "held-out")
    assert not out.exists()


def test_sample_data_into_a_file_is_refused(tmp_path: Path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    assert_user_error(llmft("sample-data", str(a_file)), "is a file")
    assert a_file.read_text() == "mine\n"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--hidden-size", "3"], "--hidden-size must be a positive multiple of 8"),
        (["--layers", "0"], "--layers must be >= 1"),
        (["--vocab-size", "1"], "--vocab-size must be >= 261"),
        (["--data", "nowhere"], "holds no train.jsonl"),
    ],
)
def test_tiny_model_shape_mistakes_are_refused_before_anything_is_built(
    args: list[str], fragment: str, tmp_path: Path
):
    out = tmp_path / "model"
    assert_user_error(llmft("tiny-model", str(out), *args), fragment)
    assert not out.exists()
