"""The optional pairwise judge (components/evaluation/judge.py) against the real vertexai SDK.

The Vertex AI evaluation service is faked at its API boundary (tests/fakes/vertex_evaluation.py);
the `EvaluateInstancesRequest`s the SDK builds from our call are compared with a reviewed golden
file (tests/golden/vertex_judge_requests.json): the location, the pairwise metric's prompt
template, and each instance with the tuned answer as the candidate response and the base answer
as the baseline.
"""

from __future__ import annotations

import json
import math
import typing

import pytest
from fakes.vertex_evaluation import FakeEvaluationService
from google.auth.credentials import AnonymousCredentials
from google.protobuf.json_format import MessageToDict

from components.evaluation.gate import GateThresholds, decide
from components.evaluation.judge import JudgeSettings, judge_pairwise
from components.params.run_checks import run_errors
from components.params.run_params import RunParams
from components.platform.platform_facts import PAIRWISE_METRICS, JudgeMetric

PROMPTS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?"]
BASE = ["Paris is the capital.", "Blue", "5"]
TUNED = ["Paris", "Red", "4"]
SETTINGS = JudgeSettings(
    metric="text_quality", project="my-project", region="us-central1",
    credentials=AnonymousCredentials(),
)  # fmt: skip


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> FakeEvaluationService:
    from google.cloud.aiplatform import initializer

    monkeypatch.setattr(initializer, "global_config", initializer._Config())
    choices = dict(zip(PROMPTS, ["TIE", "BASELINE", "CANDIDATE"], strict=True))
    return FakeEvaluationService(monkeypatch, choices)


def test_judge_requests_match_golden_and_win_rate(service: FakeEvaluationService, golden) -> None:
    result = judge_pairwise(PROMPTS, BASE, TUNED, SETTINGS)

    requests = [MessageToDict(r._pb) for r in service.requests]
    for request in requests:
        # The SDK serialises each instance with its keys in no fixed order: compare them parsed.
        instance = request["pairwiseMetricInput"]["instance"]
        instance["jsonInstance"] = json.loads(instance["jsonInstance"])
    requests.sort(key=lambda r: r["pairwiseMetricInput"]["instance"]["jsonInstance"]["prompt"])
    golden.check("vertex_judge_requests.json", requests)
    assert len(requests) == len(PROMPTS)
    for request in requests:
        instance = request["pairwiseMetricInput"]["instance"]["jsonInstance"]
        i = PROMPTS.index(instance["prompt"])
        assert instance["response"] == TUNED[i]  # the candidate is the tuned model
        assert instance["baseline_model_response"] == BASE[i]
        assert request["location"] == "projects/my-project/locations/us-central1"
    # Results come back in prompt order whatever order the threads answered in.
    assert result.choices == ["TIE", "BASELINE", "CANDIDATE"]
    assert result.win_rate == pytest.approx((1 + 0.5) / 3)
    metrics = result.metrics()
    assert metrics["judge_loss_rate"] == pytest.approx(1 / 3)
    assert metrics["judge_tie_rate"] == pytest.approx(1 / 3)
    assert metrics["judge_prompts"] == 3.0 and metrics["judge_errors"] == 0.0


def test_failed_judge_requests_are_errors_not_losses(
    monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """vertexai catches each row's exception and writes "Error" as its choice: such a row is
    reported in judge_errors, never counted as a loss, and all rows failing is an error."""
    from google.cloud.aiplatform import initializer

    monkeypatch.setattr(initializer, "global_config", initializer._Config())
    choices = dict(zip(PROMPTS, ["TIE", "BASELINE", "CANDIDATE"], strict=True))
    FakeEvaluationService(monkeypatch, choices, denied=frozenset(PROMPTS[:2]))
    with caplog.at_level("WARNING", logger="components.evaluation.judge"):
        result = judge_pairwise(PROMPTS, BASE, TUNED, SETTINGS)
    assert result.choices[2] == "CANDIDATE" and result.errors == 2
    metrics = result.metrics()
    assert metrics["judge_win_rate"] == 1.0 and metrics["judge_loss_rate"] == 0.0
    assert metrics["judge_prompts"] == 1.0 and metrics["judge_errors"] == 2.0
    assert "failed to judge 2 of 3 prompts" in caplog.text

    monkeypatch.setattr(initializer, "global_config", initializer._Config())
    FakeEvaluationService(monkeypatch, choices, denied=frozenset(PROMPTS))
    with pytest.raises(RuntimeError, match=r"failed to judge 3 of 3 prompts.*endpoints\.predict"):
        judge_pairwise(PROMPTS, BASE, TUNED, SETTINGS)


def test_judge_win_rate_gates() -> None:
    base = {"base_eval_loss": 2.0, "tuned_eval_loss": 1.0}
    passed = decide({**base, "judge_win_rate": 0.6}, GateThresholds(judge_min_win_rate=0.5))
    failed = decide({**base, "judge_win_rate": 0.4}, GateThresholds(judge_min_win_rate=0.5))
    missing = decide(base, GateThresholds(judge_min_win_rate=0.5))
    assert passed.passed and not failed.passed and not missing.passed
    assert "did not run" in missing.failures[0]
    assert decide(base, GateThresholds()).checks[-1]["name"] == "loss_improvement"


def test_judge_settings_and_run_parameters_agree() -> None:
    assert set(typing.get_args(JudgeMetric)) == {"", *PAIRWISE_METRICS}
    assert JudgeSettings().errors() == [] and not JudgeSettings().enabled
    assert "use one of" in JudgeSettings(metric="nope", project="p").errors()[0]
    assert "project or region is empty" in JudgeSettings(metric="fluency").errors()[0]
    errors = run_errors(RunParams(train_data_uri="d.jsonl", base_model="m", judge_min_win_rate=0.5))
    assert any("judge_metric is empty" in e for e in errors), errors
    errors = run_errors(RunParams(train_data_uri="d.jsonl", base_model="m", judge_metric="fluency"))
    assert any("runs in Vertex AI" in e for e in errors), errors


def test_judge_refuses_mismatched_answers() -> None:
    with pytest.raises(ValueError, match="one base and one tuned answer"):
        judge_pairwise(PROMPTS, BASE[:2], TUNED, SETTINGS)
    assert math.isnan(
        __import__("components.evaluation.judge", fromlist=["JudgeResult"])
        .JudgeResult("fluency", [], [])
        .win_rate
    )
