"""Prompt records through the Beam graph (`--data-kind prompts`, beam_preprocess/prompt_steps.py)
on the DirectRunner: text and chat prompts with their extra columns kept unchanged, validated,
deduplicated, split, every record accounted for, read back by the trainer's reader."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from beam_preprocess.cli import main
from trainer.grpo.tasks import arithmetic
from trainer.packed_data.format import PROMPTS_KIND, read_manifest
from trainer.packed_data.prompts import read_prompts


def test_prompts_keep_their_columns_and_every_record_is_accounted_for(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    good = arithmetic(60, seed=1)
    for i, r in enumerate(good):
        r["tests"] = {"cases": [i, i + 1], "note": None}  # nested columns pass through as read
        if i % 2:  # half as text prompts
            r["prompt"] = r["prompt"][0]["content"]
    duplicate = dict(good[3])
    same_prompt_other_answer = {**good[4], "answer": "-1"}  # not a duplicate: a column differs
    bad = [
        {"answer": "1"},  # missing_field
        {"prompt": "  ", "answer": "1"},  # empty_field
        {"prompt": [{"role": "assistant", "content": "hi"}], "answer": "1"},  # invalid_messages
        {"prompt": 7, "answer": "1"},  # invalid_field_type
        {"prompt": [{"role": "tool", "content": "x"}], "answer": "1"},  # tool_turns
    ]
    too_long = {"prompt": "word " * 400, "answer": "0"}
    lines = [json.dumps(r) for r in [*good, duplicate, same_prompt_other_answer, *bad, too_long]]
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    code = main(
        [
            f"--input={data}", f"--output={out}", f"--tokenizer={tiny_model_dir}",
            "--seq-len=128", "--eval-fraction=0.25", "--data-kind=prompts",
            "--max-rejected-fraction=1.0",
        ]
    )  # fmt: skip
    assert code == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["records_read"] == len(lines) == stats["accounted"]
    assert stats["kept"] == len(good) + 1 and stats["duplicates"] == 1
    assert stats["filtered_by_reason"] == {"too_long_tokens": 1}
    assert stats["rejected_by_reason"] == {
        "missing_field": 1, "empty_field": 1, "invalid_messages": 1, "invalid_field_type": 1,
        "tool_turns": 1,
    }  # fmt: skip
    assert "unused_fields" not in stats or not stats["unused_fields"]

    manifest = read_manifest(str(out))
    assert manifest.data_kind == PROMPTS_KIND and manifest.minor_version == 2
    train = read_prompts(str(out), manifest, "train")
    held_out = read_prompts(str(out), manifest, "eval")
    assert train and held_out and len(train) + len(held_out) == len(good) + 1
    by_id = Counter(r["id"] for r in train + held_out)
    assert by_id[good[4]["id"]] == 2 and max(by_id.values()) == 2
    for record in train + held_out:
        original = next(
            g for g in [*good, same_prompt_other_answer]
            if g["id"] == record["id"] and g["answer"] == record["answer"]
        )  # fmt: skip
        assert record == original  # prompt (text stays text) and every column unchanged
    # The eval split's records are also the evaluation's held-out prompts.
    eval_lines = [
        json.loads(line)
        for path in sorted((out / "eval_records").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert sorted(r["id"] for r in eval_lines) == sorted(r["id"] for r in held_out)
    assert manifest.splits["train"].rows == len(train)
