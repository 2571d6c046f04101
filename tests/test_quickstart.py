"""Foundation: the quickstart assets load with the standard transformers/datasets APIs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest


def test_sample_data_is_deterministic_and_loads_with_datasets(
    sample_data_dir: Path, tmp_path: Path
):
    from datasets import load_dataset

    from pipelines.quickstart.sample_data import TASKS, write_sample_data

    write_sample_data(tmp_path, n_train=4000, n_heldout=400, seed=0)
    for name in ("train.jsonl", "heldout.jsonl", "dirty.jsonl"):
        assert (tmp_path / name).read_bytes() == (sample_data_dir / name).read_bytes()

    ds = load_dataset("json", data_files=str(sample_data_dir / "train.jsonl"), split="train")
    assert ds.num_rows == 4000
    assert set(ds.column_names) == {"prompt", "response", "task"}
    assert set(ds["task"]) == set(TASKS)
    heldout = [json.loads(x) for x in (sample_data_dir / "heldout.jsonl").read_text().splitlines()]
    assert len(heldout) == 400
    assert not {r["prompt"] for r in heldout} & set(ds["prompt"])


def test_answers_are_exactly_checkable(sample_data_dir: Path):
    for line in (sample_data_dir / "train.jsonl").read_text().splitlines()[:700]:
        r = json.loads(line)
        p, a = r["prompt"], r["response"]
        if r["task"] == "add":
            x, y = p.removeprefix("What is ").removesuffix("?").split(" + ")
            assert int(a) == int(x) + int(y)
        elif r["task"] == "sort":
            nums = [int(t) for t in p.split(": ")[1].split()]
            assert a == " ".join(map(str, sorted(nums)))
        elif r["task"] == "reverse":
            assert a == p.split(": ")[1][::-1]


def test_dirty_variant_matches_its_report(sample_data_dir: Path):
    report = json.loads((sample_data_dir / "dirty_report.json").read_text())
    lines = (sample_data_dir / "dirty.jsonl").read_text().splitlines()
    assert report["total_lines"] == len(lines) == 4000 + sum(report["injected"].values())
    for number in report["lines"]["invalid_json"]:
        with pytest.raises(json.JSONDecodeError):
            json.loads(lines[number - 1])
    for number in report["lines"]["missing_field"]:
        assert "response" not in json.loads(lines[number - 1])
    for number in report["lines"]["empty_text"]:
        assert not json.loads(lines[number - 1])["response"].strip()


def test_tiny_model_loads_and_gives_finite_loss(tiny_model_dir: Path, sample_data_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    assert 1e6 < n_params < 2e7
    record = json.loads((sample_data_dir / "train.jsonl").read_text().splitlines()[0])
    messages = [{"role": "user", "content": record["prompt"]}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template(
        [*messages, {"role": "assistant", "content": record["response"]}], tokenize=False
    )
    assert full.startswith(prompt) and full.endswith(tok.eos_token)
    ids = tok(full, return_tensors="pt").input_ids
    assert ids[0, : len(tok(prompt).input_ids)].tolist() == tok(prompt).input_ids
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    assert math.isfinite(loss.item())
    assert abs(loss.item() - math.log(len(tok))) < 1.5  # untrained: close to uniform


def test_cli_help_and_user_error(tmp_path: Path):
    llmft = [sys.executable, "-m", "pipelines.cli"]
    out = subprocess.run([*llmft, "--help"], capture_output=True, text=True, check=True)
    assert "sample-data" in out.stdout and "tiny-model" in out.stdout
    bad = subprocess.run(
        [*llmft, "sample-data", str(tmp_path), "--train", "3"], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
