"""Evaluation building blocks that need no model: metrics, gate, report, input readers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from components.evaluation import data as data_io
from components.evaluation.gate import GateThresholds, decide
from components.evaluation.report import plot_curves_png, read_training_curve, render_report
from components.evaluation.text_metrics import chrf, exact_match, normalize_answer

METRICS = {
    "base_eval_loss": 3.0,
    "tuned_eval_loss": 2.0,
    "base_exact_match": 0.1,
    "tuned_exact_match": 0.5,
}


def test_normalize_answer_keeps_meaningful_punctuation() -> None:
    assert normalize_answer("  1 235 m.\n") == "1 235 m"
    assert normalize_answer("ＡBC") == "abc"  # NFKC folds full-width letters
    assert normalize_answer("-5") != normalize_answer("5")
    assert exact_match(["Kitolu.", "12", "3 cm"], ["kitolu", " 12 ", "3 m"]) == pytest.approx(2 / 3)
    assert exact_match([], []) == 0.0
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        exact_match(["a", "b"], ["a"])


def test_chrf_bounds_and_hand_computed_value() -> None:
    assert chrf(["same answer"], ["same answer"]) == pytest.approx(100.0)
    assert chrf(["xyz"], ["abc"]) == 0.0
    assert chrf([""], ["abc"]) == 0.0
    # hyp "ab", ref "abc": 1-grams P=2/2 R=2/3, 2-grams P=1/1 R=1/2 (3-grams: hyp has none).
    p, r = (1 + 1) / 2, (2 / 3 + 1 / 2) / 2
    assert chrf(["ab"], ["abc"]) == pytest.approx(100 * 5 * p * r / (4 * p + r))
    # Corpus level: statistics are summed before the F-score, not averaged per sentence.
    corpus = chrf(["ab", "abc"], ["abc", "abc"])
    assert chrf(["ab"], ["abc"]) < corpus < 100
    # Whitespace is ignored, as in sacrebleu's default chrF.
    assert chrf(["1 2 3"], ["123"]) == pytest.approx(100.0)


CHRF_PAIRS = [
    ("42", "42"), ("4", "42"), ("420", "42"), ("The answer is 42.", "42"), ("Paris", "Paris."),
    ("paris", "Paris"), ("3 m", "3 cm"), ("", "abc"), ("abc", "a"), ("x", "y"), ("ab", "abc"),
    ("Kitolu is the capital", "Kitolu"), ("1 235 m", "1235 m"), ("é ñ ü", "e n u"),
    ("long hypothesis about the river delta", "the river delta"), ("-5", "5"), ("ok", "o k"),
]  # fmt: skip
"""Short references (fewer characters than chrF's order 6) are where implementations differ."""


@pytest.mark.parametrize("size", [1, 4, len(CHRF_PAIRS)])
def test_chrf_equals_sacrebleu(size: int) -> None:
    from sacrebleu.metrics import CHRF

    reference = CHRF()
    for start in range(0, len(CHRF_PAIRS), size):
        hyps, refs = zip(*CHRF_PAIRS[start : start + size], strict=True)
        expected = reference.corpus_score(list(hyps), [list(refs)]).score
        assert chrf(hyps, refs) == pytest.approx(expected, abs=1e-9), (hyps, refs)


def test_gate_passes_and_fails_on_thresholds() -> None:
    assert decide(METRICS, GateThresholds()).passed
    assert decide(METRICS, GateThresholds(min_loss_improvement=1.0, min_exact_match=0.5)).passed
    strict = decide(METRICS, GateThresholds(min_loss_improvement=1.5, min_exact_match=0.6))
    assert not strict.passed
    assert [c["name"] for c in strict.checks if not c["passed"]] == [
        "loss_improvement",
        "exact_match",
    ]
    assert "required >= 1.5000" in strict.failures[0]
    worse = decide({**METRICS, "tuned_eval_loss": 3.2}, GateThresholds())
    assert not worse.passed


def test_gate_exact_match_without_generation_fails() -> None:
    metrics = {"base_eval_loss": 3.0, "tuned_eval_loss": 2.0}
    decision = decide(metrics, GateThresholds(min_exact_match=0.2))
    assert not decision.passed
    assert "no generation examples" in decision.failures[0]


def test_gate_champion_comparison() -> None:
    champion = {**METRICS, "champion_eval_loss": 1.9, "champion_exact_match": 0.55}
    decision = decide(champion, GateThresholds())
    assert not decision.passed
    assert {c["name"] for c in decision.checks if not c["passed"]} == {
        "champion_loss",
        "champion_exact_match",
    }
    assert decide(champion, GateThresholds(champion_tolerance=0.1)).passed
    assert decide(champion, GateThresholds(compare_to_champion=False)).passed


def test_gate_threshold_errors_are_collected() -> None:
    with pytest.raises(ValueError) as info:
        decide(
            METRICS,
            GateThresholds(
                min_exact_match=1.5, champion_tolerance=-1, min_loss_improvement=math.nan
            ),
        )
    text = str(info.value)
    assert (
        "min_exact_match" in text
        and "champion_tolerance" in text
        and "min_loss_improvement" in text
    )


def test_training_curve_reader_skips_noise(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        json.dumps({"config": {"lr": 1e-3}})
        + "\n"
        + "".join(json.dumps({"step": s, "loss": 5.0 / s, "lr": 1e-3}) + "\n" for s in range(1, 6))
        + json.dumps({"step": 5, "eval_loss": 1.5})
        + "\n"
        + '{"step": 6, "lo'  # a partly written last line
    )
    curves = read_training_curve(str(path))
    assert curves["train loss"] == [(float(s), 5.0 / s) for s in range(1, 6)]
    assert curves["eval loss"] == [(5.0, 1.5)]
    png = plot_curves_png(curves)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_report_escapes_untrusted_text() -> None:
    decision = decide(METRICS, GateThresholds())
    page = render_report(
        metrics=METRICS,
        decision=decision,
        models={"base": "/m/base", "tuned": "/m/<tuned>"},
        samples=[
            {
                "prompt": "<script>alert(1)</script>",
                "reference": "a & b",
                "base": "<img src=x onerror=alert(1)>",
                "tuned": "a & b",
                "base_match": False,
                "tuned_match": True,
            }
        ],
        curves=None,
    )
    assert "<script>" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "/m/&lt;tuned&gt;" in page
    assert "No training metrics were given." in page
    assert 'data-metric="eval_loss"' in page and 'class="better"' in page


def test_examples_from_prompt_response_and_messages(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(
        json.dumps({"prompt": "What is 1 + 1?", "response": "2", "task": "add"})
        + "\n\n"
        + json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Reverse the word: abc"},
                    {"role": "assistant", "content": "cba"},
                ]
            }
        )
        + "\n"
        + json.dumps({"prompt": "never read"})
        + "\n"
    )
    examples = data_io.read_examples([str(path)], max_examples=2)
    assert [(e.prompt_text, e.reference) for e in examples] == [
        ("What is 1 + 1?", "2"),
        ("Reverse the word: abc", "cba"),
    ]
    assert examples[1].messages[0] == {"role": "system", "content": "Be brief."}
    with pytest.raises(
        ValueError, match=r"records.jsonl:4: a record needs 'prompt' and 'response'"
    ):
        data_io.read_examples([str(path)], max_examples=10)


def test_unreachable_hub_id_is_a_clear_error() -> None:
    """conftest keeps the suite offline, so a Hub id that is not cached cannot load."""
    from components.evaluation.loading import read_tokenizer
    from components.runtime.model_location import is_hub_id

    assert is_hub_id("someorg/some-model")
    assert not is_hub_id("/abs/path") and not is_hub_id("gs://b/m") and not is_hub_id("a/b/c")
    with pytest.raises(
        ValueError, match="neither a local directory nor loadable from the Hugging Face Hub"
    ):
        read_tokenizer("someorg/some-model", "base model")


def test_gate_forgetting_check() -> None:
    probes = {"base_general_correct": 0.9, "tuned_general_correct": 0.6, "general_retained": 0.6}
    assert decide({**METRICS, **probes}, GateThresholds(min_general_retained=0.5)).passed
    failed = decide({**METRICS, **probes}, GateThresholds(min_general_retained=0.8))
    assert [c["name"] for c in failed.checks if not c["passed"]] == ["general_retained"]
    assert "retained 0.600" in failed.failures[0]
    # Asked for but not scored: fail; scored but the base knew none: nothing to lose, pass.
    assert not decide(METRICS, GateThresholds(min_general_retained=0.5)).passed
    nothing = {"base_general_correct": 0.0, "tuned_general_correct": 0.0}
    assert decide({**METRICS, **nothing}, GateThresholds(min_general_retained=0.5)).passed
    with pytest.raises(ValueError, match="min_general_retained"):
        decide(METRICS, GateThresholds(min_general_retained=1.5))


def test_general_probes_file_and_scoring() -> None:
    from components.evaluation.general_probes import Probe, load_probes, retained

    probes = load_probes()
    assert len(probes) >= 24 and len({p.question for p in probes}) == len(probes)
    paris = Probe("What is the capital of France?", ("Paris",))
    assert paris.is_correct("The capital of France is Paris.")
    assert not paris.is_correct("It is Parisville, I think.")  # whole words only
    seven = Probe("How many days are in a week?", ("7", "seven"))
    assert seven.is_correct("There are Seven days in a week.") and not seven.is_correct("17")
    zero = Probe("At what temperature in Celsius does water freeze?", ("0",))
    assert zero.is_correct("At 0 degrees.") and not zero.is_correct("It freezes at -18.0°C.")
    assert retained([True, True, False], [True, False, True]) == 0.5
    assert retained([False], [True]) is None


def test_evaluation_given_a_gpu_stops_when_cuda_is_unavailable(monkeypatch) -> None:
    """N1: the pipeline gives the evaluate task a GPU and LLMFT_EXPECT_CUDA=1; the old code then
    scored the models in fp32 on CPU without a word."""
    import torch

    from components.evaluation.loading import pick_device
    from trainer.cuda_guard import EXPECT_CUDA_ENV

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(EXPECT_CUDA_ENV, "1")
    with pytest.raises(RuntimeError, match="evaluation was given GPUs"):
        pick_device()
    monkeypatch.delenv(EXPECT_CUDA_ENV)
    assert pick_device() == (torch.device("cpu"), torch.float32)
