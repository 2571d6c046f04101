"""Preference pairs through the Beam graph (`--data-kind preference`, beam_preprocess/
preference_steps.py) on the DirectRunner: the same packed rows as the in-memory path
(`beam_preprocess.preference.write_dataset`) for the same records, every shape TRL uses, and every
bad record accounted for in stats.json and the dead letters."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from packed_fixtures import read_jsonl

from beam_preprocess import pairs
from beam_preprocess.preference import main, write_dataset
from beam_preprocess.record_steps import split_of
from trainer.packed_data.format import SPLITS, read_manifest
from trainer.packed_data.reader import read_split

SEQ_LEN = 256
EVAL_FRACTION = 0.25


def good_records(sample_data_dir: Path, n: int) -> list[dict[str, Any]]:
    """Pairs in the three accepted shapes, in turn: strings, TRL's conversational form, chat
    pairs (some with a system turn: a history of two messages)."""
    recs = read_jsonl(sample_data_dir / "train.jsonl", n)
    out: list[dict[str, Any]] = []
    for i, r in enumerate(recs):
        prompt, chosen, rejected = r["prompt"], r["response"], recs[(i + 3) % n]["response"]
        if i % 3 == 0:
            out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        elif i % 3 == 1:
            user = [{"role": "user", "content": prompt}]
            out.append(
                {
                    "prompt": user,
                    "chosen": [{"role": "assistant", "content": chosen}],
                    "rejected": [{"role": "assistant", "content": rejected}],
                }
            )
        else:
            history = [{"role": "user", "content": prompt}]
            if i % 2:
                history.insert(0, {"role": "system", "content": "Answer with a number."})
            out.append(
                {
                    "chosen": [*history, {"role": "assistant", "content": chosen}],
                    "rejected": [*history, {"role": "assistant", "content": rejected}],
                }
            )
    return out


def test_beam_writes_the_rows_of_the_in_memory_path_and_accounts_for_every_record(
    tmp_path: Path, tiny_model_dir: Path, sample_data_dir: Path
) -> None:
    from transformers import AutoTokenizer

    good = good_records(sample_data_dir, 120)
    first = good[0]
    too_long = {**first, "chosen": "word " * 400}
    conversational_copy = {  # the same pair as `first` in another shape: a duplicate too
        "prompt": [{"role": "user", "content": first["prompt"]}],
        "chosen": [{"role": "assistant", "content": first["chosen"]}],
        "rejected": [{"role": "assistant", "content": first["rejected"]}],
    }
    bad = [
        {"prompt": "2+2?", "chosen": "4"},  # pair_shape
        {"chosen": good[2]["chosen"], "rejected": [{"role": "assistant", "content": "5"}]},
        {"prompt": "2+2?", "chosen": "  ", "rejected": "5"},  # empty_response
        {"prompt": [{"role": "tool", "content": "x"}], "chosen": "4", "rejected": "5"},
        {"prompt": "2+2?", "chosen": " 4", "rejected": "4 "},  # identical_responses (cleaned)
        {  # pair_shape: a text prompt with message-list responses
            "prompt": "2+2?",
            "chosen": [{"role": "assistant", "content": "4"}],
            "rejected": [{"role": "assistant", "content": "5"}],
        },
    ]
    lines = [json.dumps(r) for r in [*good, too_long, first, conversational_copy, *bad]]
    lines.insert(7, "{not json")
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(lines) + "\n")

    beam_out = tmp_path / "beam"
    code = main(
        [
            f"--input={data}", f"--output={beam_out}", f"--tokenizer={tiny_model_dir}",
            f"--seq-len={SEQ_LEN}", f"--eval-fraction={EVAL_FRACTION}",
            "--max-rejected-fraction=1.0",
        ]
    )  # fmt: skip
    assert code == 0

    # Accounting: every line read is kept, filtered, a duplicate or rejected, with its reason.
    stats = json.loads((beam_out / "stats.json").read_text())
    assert stats["records_read"] == len(lines) == stats["accounted"]
    assert stats["kept"] == len(good) and stats["duplicates"] == 2
    assert stats["filtered_by_reason"] == {"too_long_tokens": 1}
    assert stats["rejected_by_reason"] == {
        "invalid_json": 1, "pair_shape": 3, "pair_history": 1, "empty_response": 1,
        "identical_responses": 1,
    }  # fmt: skip
    letters = [
        json.loads(line)
        for path in sorted(beam_out.glob("*/part-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert Counter(d["reason"] for d in letters) == Counter(
        {"invalid_json": 1, "pair_shape": 3, "pair_history": 1, "empty_response": 1,
         "identical_responses": 1, "too_long_tokens": 1}
    )  # fmt: skip
    text_prompt = next(
        d
        for d in letters
        if isinstance(d["record"], dict)  # an invalid_json letter keeps the line as text
        and d["record"].get("prompt") == "2+2?"
        and isinstance(d["record"].get("chosen"), list)
    )
    assert "give the prompt as messages" in text_prompt["error"]
    filtered = next(d for d in letters if d["reason"] == "too_long_tokens")
    assert filtered["record"]["chosen"] == too_long["chosen"].strip()  # cleaned, as a record
    assert not (beam_out / "eval_records").exists()  # pairs have no reference answer

    # The in-memory path on the same kept records, split by the same rule, in source order.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    by_split: dict[str, list[dict[str, Any]]] = {name: [] for name in SPLITS}
    for record in [*good, too_long]:
        example = pairs.example_of(record)[0]
        by_split[split_of(example, EVAL_FRACTION, "llmft")].append(record)
    assert by_split["eval"] and by_split["train"]
    one_out = tmp_path / "one"
    write_dataset(one_out, tokenizer, by_split, SEQ_LEN)

    beam, one = read_manifest(str(beam_out)), read_manifest(str(one_out))
    assert beam.data_kind == one.data_kind == "preference" and beam.minor_version >= 1
    for split in SPLITS:
        b, o = beam.splits[split], one.splits[split]
        assert (b.rows, b.documents, b.tokens, b.target_tokens) == (
            o.rows, o.documents, o.tokens, o.target_tokens
        ), split  # fmt: skip
        beam_rows = read_split(str(beam_out), beam, split)
        one_rows = read_split(str(one_out), one, split)
        assert beam_rows.columns() == one_rows.columns()
        for column in beam_rows.columns():
            np.testing.assert_array_equal(getattr(beam_rows, column), getattr(one_rows, column))
    assert beam.splits["train"].documents == 2 * sum(
        1 for r in by_split["train"] if r is not too_long
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--record-format=chat"], "record format 'chat' shapes instruction data"),
        (["--prompt-field=question"], "--prompt-field: not applicable to data kind preference"),
        (["--train-on-prompt"], "--train-on-prompt: the prompt of a pair is never a target"),
        (["--overlong=truncate"], "--overlong truncate: a pair longer than --seq-len is always"),
    ],
)
def test_preference_options_that_have_no_meaning_are_refused(
    tmp_path: Path, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    argv = [f"--input={data}", f"--output={tmp_path / 'out'}", "--tokenizer=t", "--seq-len=64"]
    assert main([*argv, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not (tmp_path / "out").exists()  # refused before anything was written
