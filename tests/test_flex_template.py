"""The preprocessing as a Dataflow Flex Template: parameters, flag translation, launcher entry.

The launcher entry runs for real on the DirectRunner (a Flex Template launch itself needs
Dataflow); `--finalize`, which writes manifest.json after a template job, must write the very
manifest the pipeline step writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beam_preprocess import flex_template
from beam_preprocess.options import help_parser


def test_every_pipeline_flag_is_a_template_parameter():
    params = {p["name"]: p for p in flex_template.parameters()}
    flags = {a.dest for a in help_parser()._actions if a.option_strings and a.dest != "help"}
    assert len(params) == len(flags)
    assert {n for n, p in params.items() if not p["isOptional"]} == {
        "input",
        "output",
        "tokenizer",
        "seq_len",
    }
    assert params["data_kind"]["regexes"] == ["^(instruction|text|preference|prompts)$"]
    assert params["train_on_prompt"]["regexes"] == ["^(true|false)$"]
    assert "no_chat_template_fast_path" in params
    assert all("-" not in name for name in params)


def test_template_flags_become_pipeline_flags():
    argv = [
        "--input=gs://b/raw/*.jsonl",
        "--train_on_prompt=true",
        "--overwrite=false",
        "--collapse_whitespace=TRUE",
        "--seq_len=512",
        "--runner=DataflowRunner",
    ]
    assert flex_template.to_pipeline_argv(argv) == [
        "--input=gs://b/raw/*.jsonl",
        "--train_on_prompt",
        "--collapse_whitespace",
        "--seq_len=512",
        "--runner=DataflowRunner",
    ]
    with pytest.raises(ValueError, match="--overwrite=yes: use true or false"):
        flex_template.to_pipeline_argv(["--overwrite=yes"])


@pytest.mark.slow
@pytest.mark.integration  # a Beam pipeline run
def test_launcher_entry_runs_the_pipeline_and_finalize_rewrites_the_same_manifest(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    records = (sample_data_dir / "train.jsonl").read_text().splitlines()[:300]
    source = tmp_path / "raw.jsonl"
    source.write_text("\n".join(records) + "\n")
    out = tmp_path / "dataset"
    params = [
        f"--input={source}",
        f"--output={out}",
        f"--tokenizer={tiny_model_dir}",
        "--seq_len=256",
        "--overwrite=false",
        "--train_on_prompt=false",
    ]
    assert flex_template.main(params) == 0
    written = json.loads((out / "manifest.json").read_text())
    assert written["splits"]["train"]["rows"] > 0
    (out / "manifest.json").unlink()
    assert flex_template.main(["--finalize", *params]) == 0
    assert json.loads((out / "manifest.json").read_text()) == written
    capsys.readouterr()
    assert flex_template.main(["--finalize", f"--input={source}", f"--output={tmp_path / 'none'}",
                               f"--tokenizer={tiny_model_dir}", "--seq_len=4"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(
        "error: "
    ) and "--seq-len must be an integer in [16, 131072]" in "\n".join(err)
