"""Optional pairwise judge: the Vertex AI Gen AI evaluation service compares the base model's and
the tuned model's answers to the same held-out prompts.

Off by default (`judge_metric=""`). When on, `judge_pairwise` sends each (prompt, tuned answer,
base answer) triple through `vertexai.evaluation.EvalTask` with one of the service's pairwise
model-based metrics (`PAIRWISE_METRICS`): the tuned model is the candidate, the base the
baseline; the service's judge model picks CANDIDATE, BASELINE or TIE per prompt and explains why.
The win rate (ties count half) is reported and may gate registration (`judge_min_win_rate`).
The answers are the ones the evaluation already generated (generations.jsonl), so the judge adds
no model time, only one service request per prompt.

Requests go to the project's Vertex AI region with the task's credentials (the pipeline's
service account needs `aiplatform.endpoints.predict`, in roles/aiplatform.user). The tests fake
the service at its API boundary (EvaluationServiceClient.evaluate_instances) and compare the
requests with reviewed golden files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from components.platform.platform_facts import PAIRWISE_METRICS

log = logging.getLogger(__name__)

CANDIDATE, BASELINE, TIE = "CANDIDATE", "BASELINE", "TIE"
JUDGED = (CANDIDATE, BASELINE, TIE)
"""The choices of a judged prompt; the SDK writes "Error" for a row whose request failed."""


@dataclass(frozen=True)
class JudgeSettings:
    """Which judge, where."""

    metric: str = ""
    """One of PAIRWISE_METRICS; "" turns the judge off."""
    project: str = ""
    """Google Cloud project whose Vertex AI evaluation service judges."""
    region: str = ""
    """Vertex AI region of the evaluation service (the run's `region`)."""
    credentials: Any = field(default=None, compare=False, repr=False)
    """google.auth credentials; None: the environment's (the pipeline task's service account)."""

    @property
    def enabled(self) -> bool:
        return bool(self.metric)

    def errors(self) -> list[str]:
        if not self.metric:
            return []
        errors = []
        if self.metric not in PAIRWISE_METRICS:
            errors.append(
                f"judge_metric={self.metric!r}: use one of {', '.join(PAIRWISE_METRICS)} "
                '(or "" for no judge)'
            )
        if not self.project or not self.region:
            errors.append(
                "judge_metric is set but project or region is empty: the judge runs in Vertex AI"
            )
        return errors


@dataclass(frozen=True)
class JudgeResult:
    """What the judge decided over all prompts."""

    metric: str
    choices: list[str]
    """Per prompt: CANDIDATE (tuned better), BASELINE (base better), TIE, or what the SDK wrote
    for a row the service failed to answer ("Error"): such a row is not judged."""
    explanations: list[str]

    @property
    def judged(self) -> list[str]:
        """The choices of the prompts the service did judge."""
        return [c for c in self.choices if c in JUDGED]

    @property
    def errors(self) -> int:
        """Prompts the service failed to judge (permission, region, quota): never a loss."""
        return len(self.choices) - len(self.judged)

    @property
    def win_rate(self) -> float:
        """Tuned wins plus half the ties, over the prompts judged."""
        judged = self.judged
        if not judged:
            return float("nan")
        return (judged.count(CANDIDATE) + 0.5 * judged.count(TIE)) / len(judged)

    def metrics(self) -> dict[str, float]:
        judged = self.judged
        n = len(judged)
        return {
            "judge_win_rate": self.win_rate,
            "judge_loss_rate": judged.count(BASELINE) / n if n else float("nan"),
            "judge_tie_rate": judged.count(TIE) / n if n else float("nan"),
            "judge_prompts": float(n),
            "judge_errors": float(self.errors),
        }


def _metric(name: str) -> Any:
    from vertexai.evaluation import MetricPromptTemplateExamples

    return getattr(MetricPromptTemplateExamples.Pairwise, name.upper())


def judge_pairwise(
    prompts: list[str], base: list[str], tuned: list[str], settings: JudgeSettings
) -> JudgeResult:
    """Judge tuned (candidate) against base (baseline) answers to the same prompts."""
    import pandas as pd
    from google.cloud.aiplatform import initializer
    from vertexai.evaluation import EvalTask

    if not (len(prompts) == len(base) == len(tuned)) or not prompts:
        raise ValueError("the judge needs one base and one tuned answer per prompt, and a prompt")
    # `vertexai.init` is this config's bound method; calling the config itself always reaches
    # the config the evaluation client is built from.
    initializer.global_config.init(
        project=settings.project, location=settings.region, credentials=settings.credentials
    )
    metric = _metric(settings.metric)
    dataset = pd.DataFrame({"prompt": prompts, "response": tuned, "baseline_model_response": base})
    log.info(
        "judging %d prompts pairwise (%s) in %s", len(prompts), metric.metric_name, settings.region
    )
    result = EvalTask(dataset=dataset, metrics=[metric]).evaluate()
    table: Any = result.metrics_table
    choice_col = f"{metric.metric_name}/pairwise_choice"
    explanation_col = f"{metric.metric_name}/explanation"
    if table is None or choice_col not in table:
        raise RuntimeError(
            f"the Vertex AI evaluation service returned no {choice_col!r} column "
            f"(got {'nothing' if table is None else ', '.join(map(str, table.columns))})"
        )
    choices = [str(c) for c in table[choice_col]]
    explanations = [str(e) for e in table.get(explanation_col, [""] * len(choices))]
    judged = JudgeResult(metric=settings.metric, choices=choices, explanations=explanations)
    if judged.errors:
        # vertexai catches each row's exception and only logs it: say what failed.
        first = next(i for i, c in enumerate(choices) if c not in JUDGED)
        what = (
            f"the Vertex AI evaluation service failed to judge {judged.errors} of "
            f"{len(choices)} prompts in {settings.region} (first: {choices[first]}: "
            f"{explanations[first]})"
        )
        if not judged.judged:
            raise RuntimeError(
                f"{what}: check that the pipeline's service account has "
                "aiplatform.endpoints.predict, that the region offers the Gen AI evaluation "
                "service, and the judge model's quota"
            )
        log.warning("%s: the rates count the %d judged prompts only", what, len(judged.judged))
    log.info("judge: tuned win rate %.3f over %d prompts", judged.win_rate, len(judged.judged))
    return judged
