"""Fault: a chat template that reaches for Python's internals (issue 51, round 3).

`{{ cycler.__init__.__globals__.os.system(...) }}` is stopped by Jinja's sandbox (transformers
renders chat templates in an ImmutableSandboxedEnvironment), but `llmft preprocess` then ended in
a SecurityError traceback from a Beam worker. Now: exit 2 before anything is written, one `error:`
line saying the template uses something a template may not, and what; whether the template came
from `--chat-template` or from the tokenizer's own files, for instruction and preference data. A
template that only misbehaves on some records' content makes those records dead letters.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from faults.conftest import error_lines, llmft_process, preprocess

pytestmark = pytest.mark.integration

ESCAPE = '{{ cycler.__init__.__globals__.os.system("touch PWNED") }}'
FORMAT = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
GENERATION = "{% if add_generation_prompt %}<|assistant|>{% endif %}"


def _refused(result, out: Path, cwd: Path) -> None:
    assert result.returncode == 2, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    errors = error_lines(result.output)
    assert len(errors) == 1, result.output[-3000:]
    assert "uses something a template may not" in errors[0], errors
    assert "access to attribute '__init__'" in errors[0], errors
    assert not out.exists()
    assert not (cwd / "PWNED").exists()


@pytest.mark.parametrize("kind", ["instruction", "preference"])
def test_a_template_escaping_the_sandbox_is_one_error_line(
    kind: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    records = tmp_path / "train.jsonl"
    record = {"prompt": "p", "response": "r"}
    if kind == "preference":
        record = {"prompt": "p", "chosen": "good", "rejected": "bad"}
    records.write_text(json.dumps(record) + "\n")
    out = tmp_path / "packed"
    result = llmft_process(
        "preprocess", f"--input={records}", f"--output={out}", f"--tokenizer={tiny_model_dir}",
        "--seq-len=64", f"--data-kind={kind}", f"--chat-template={ESCAPE}{FORMAT}{GENERATION}",
    )  # fmt: skip
    _refused(result, out, tmp_path)


def test_a_tokenizer_whose_own_template_escapes_is_refused(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(tiny_model_dir, tokenizer)
    (tokenizer / "chat_template.jinja").write_text(ESCAPE + FORMAT + GENERATION)
    records = tmp_path / "train.jsonl"
    records.write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n")
    out = tmp_path / "packed"
    result = llmft_process(
        "preprocess", f"--input={records}", f"--output={out}", f"--tokenizer={tokenizer}",
        "--seq-len=64",
    )  # fmt: skip
    _refused(result, out, tmp_path)


def test_a_template_escaping_only_on_some_content_rejects_those_records(
    tiny_model_dir: Path, tmp_path: Path
):
    template = (
        "{% for m in messages %}{% if 'attack' in m.content %}" + ESCAPE + "{% endif %}"
        "<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}" + GENERATION
    )

    # Multi-turn conversations are rendered by Jinja (a single turn may take the probe-checked
    # string pattern, which never runs the template on a record's content at all).
    def turns(i: int, words: str) -> dict:
        return {
            "messages": [
                {"role": "user", "content": f"question {i}"},
                {"role": "assistant", "content": f"answer {i}"},
                {"role": "user", "content": f"{words} {i}"},
                {"role": "assistant", "content": f"answer {i} again"},
            ]
        }

    rows = [turns(i, "and") for i in range(10)]
    rows.insert(4, turns(99, "an attack"))
    records = tmp_path / "train.jsonl"
    records.write_text("".join(json.dumps(row) + "\n" for row in rows))
    stats, letters = preprocess(
        [records], tmp_path / "packed", tiny_model_dir, f"--chat-template={template}"
    )
    assert stats["records_read"] == 11 and stats["kept"] == 10, stats
    assert [letter["reason"] for letter in letters] == ["chat_template_error"], letters
    assert "SecurityError" in letters[0]["error"], letters
    assert letters[0]["source"].endswith("train.jsonl:5"), letters
