"""General-knowledge probes: does the fine-tuned model still know what its base knew?

Fine-tuning on a narrow task can make a model worse at everything else (catastrophic forgetting),
and neither the eval split's loss nor its task metrics see that. So evaluation can also ask each
model a small fixed set of everyday questions (`general_probes.jsonl`, shipped with the package,
written for this project and checked against SmolLM2-135M-Instruct, which answers every one) and
the quality gate can require that the tuned model still answers at least a fraction of those its
base answered (`min_general_retained`). Recurring fine-tunes use it so that a drifting data window
cannot slowly erode the model.

An answer counts as correct when one of the probe's accepted answers occurs in it as whole words,
case-insensitively (a number not as part of a larger one: "0" is not in "-18.0"): instruct models
answer in sentences ("The capital of France is Paris."), and the accepted answers are chosen so
that a wrong sentence does not contain them. Questions whose base answers were right only by
accident (a wrong explanation that contains the number) were left out of the set. Probes are scored
only when the gate asks for them: tiny models trained from scratch answer none, so the check is
off by default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from components.evaluation.data import Example
from components.evaluation.text_metrics import normalize_answer

PROBES_FILE = Path(__file__).with_name("general_probes.jsonl")
MAX_NEW_TOKENS = 32
"""Enough for a one-sentence answer; the accepted answer comes early in every sentence."""


@dataclass(frozen=True)
class Probe:
    question: str
    answers: tuple[str, ...]
    """Accepted answers; any one occurring as whole words makes the answer correct."""

    def example(self) -> Example:
        return Example(
            messages=[{"role": "user", "content": self.question}],
            reference=self.answers[0],
            prompt_text=self.question,
        )

    def is_correct(self, answer: str) -> bool:
        text = normalize_answer(answer)
        return any(
            re.search(rf"(?<![\w.]){re.escape(normalize_answer(a))}(?!\w|[.,]\d)", text)
            for a in self.answers
        )


def load_probes(path: Path = PROBES_FILE) -> list[Probe]:
    """The probe set: one JSON object per line, {"question": str, "answers": [str, ...]}."""
    probes = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not record.get("question") or not record.get("answers"):
            raise ValueError(f"{path}:{number}: a probe needs a question and accepted answers")
        probes.append(Probe(record["question"], tuple(record["answers"])))
    return probes


def retained(base_correct: Sequence[bool], tuned_correct: Sequence[bool]) -> float | None:
    """Fraction of the probes the base answered that the tuned model still answers (None: the
    base answered none, so there is nothing to retain)."""
    kept = [tuned for base, tuned in zip(base_correct, tuned_correct, strict=True) if base]
    return sum(kept) / len(kept) if kept else None
