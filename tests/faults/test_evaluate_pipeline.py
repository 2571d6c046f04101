"""Faults of what `llmft evaluate` and `llmft run` are given (issue 36, round 2, "Evaluate and
pipeline"): a tuned model without its weights or without its tokenizer, a dataset without eval
rows, a base model named .gguf that is no GGUF file, an unknown `--param`.

Each is refused before any model is loaded or any step starts (exit 2, one `error:` line, nothing
created), except the tuned model without a tokenizer, which is evaluated with the base model's
tokenizer (after checking it against the dataset's) and says so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft

from faults.conftest import error_lines


def _copy_without(model: Path, dest: Path, *patterns: str) -> Path:
    shutil.copytree(model, dest)
    for pattern in patterns:
        for path in dest.glob(pattern):
            path.unlink()
    return dest


def _evaluate(base: Path | str, tuned: Path | str, data: Path, out: Path, *extra: str):
    return llmft(
        "evaluate", "--base", str(base), "--tuned", str(tuned), "--data", str(data),
        "--output", str(out), "--max-examples", "0", *extra,
    )  # fmt: skip


def _refused(result, *fragments: str) -> None:
    assert_user_error(result, *fragments)
    assert len(error_lines(result.output)) == 1, result.output


@pytest.mark.unit
def test_evaluate_refuses_a_tuned_model_without_weights(
    tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    tuned = _copy_without(tiny_model_dir, tmp_path / "tuned", "*.safetensors")
    out = tmp_path / "eval"
    _refused(_evaluate(tiny_model_dir, tuned, small_dataset, out), "no weights", "llmft train")
    assert not out.exists()


@pytest.mark.integration
def test_evaluate_uses_the_base_tokenizer_for_a_tuned_model_without_one(
    tiny_model_dir: Path, small_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    tuned = _copy_without(
        tiny_model_dir, tmp_path / "tuned", "tokenizer*.json", "chat_template.jinja"
    )
    out = tmp_path / "eval"
    with caplog.at_level("WARNING"):
        result = _evaluate(tiny_model_dir, tuned, small_dataset, out, "--max-eval-rows", "2")
    assert result.exit_code == 0, result.output
    assert "has no tokenizer files: using the base model's" in caplog.text
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    # The same weights and the same tokenizer: the same loss (nothing silently different).
    assert metrics["tuned_eval_loss"] == pytest.approx(metrics["base_eval_loss"])


@pytest.mark.unit
def test_evaluate_refuses_a_dataset_without_eval_rows(tiny_model_dir: Path, tmp_path: Path):
    from packed_fixtures import write_packed_dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    records = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(20)]
    data = tmp_path / "no_eval"
    write_packed_dataset(data, tokenizer, {"train": records, "eval": []}, seq_len=64)
    out = tmp_path / "eval"
    _refused(_evaluate(tiny_model_dir, tiny_model_dir, data, out), "eval split", "is empty")
    assert not out.exists()


@pytest.fixture
def fake_gguf(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """safetensors bytes under a .gguf name (a mislabelled download)."""
    path = tmp_path / "model.Q4_0.gguf"
    shutil.copyfile(tiny_model_dir / "model.safetensors", path)
    return path


@pytest.mark.unit
def test_a_base_model_named_gguf_that_is_not_one_is_refused_everywhere(
    fake_gguf: Path, tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    out = tmp_path / "out"
    _refused(_evaluate(fake_gguf, tiny_model_dir, small_dataset, out), "GGUF")
    result = llmft(
        "train", "--model", str(fake_gguf), "--data", str(small_dataset), "--output", str(out),
        "--max-steps", "1", "--rdzv-backend", "c10d",
    )  # fmt: skip
    _refused(result, "is not a GGUF file")  # before torchrun starts, not in every rank
    for dry_run in (["--dry-run"], []):
        result = llmft(
            "run", "--backend", "local", "--param", f"base_model={fake_gguf}",
            "--param", f"workdir={out}", *dry_run,
        )  # fmt: skip
        _refused(result, "is not a GGUF file")
    records = tmp_path / "train.jsonl"
    records.write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n")
    result = llmft(
        "preprocess", f"--input={records}", f"--output={out}", f"--tokenizer={fake_gguf}",
        "--seq-len=64",
    )  # fmt: skip
    _refused(result, "GGUF")
    assert not out.exists()


@pytest.mark.unit
def test_an_unknown_param_is_refused_with_the_close_name(tmp_path: Path):
    for dry_run in (["--dry-run"], []):
        result = llmft(
            "run", "--backend", "local", "--param", "max_step=3",
            "--param", f"workdir={tmp_path / 'w'}", *dry_run,
        )  # fmt: skip
        _refused(result, "unknown parameter(s) max_step (did you mean max_steps?)")
    assert not (tmp_path / "w").exists()
