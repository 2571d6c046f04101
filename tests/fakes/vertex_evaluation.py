"""The Vertex AI Gen AI evaluation service, faked at its API boundary.

`FakeEvaluationService` replaces `EvaluationServiceClient.evaluate_instances` (the one call the
`vertexai.evaluation` SDK makes per row and metric), records every `EvaluateInstancesRequest` the
real SDK builds, and answers each pairwise request with a real `EvaluateInstancesResponse` whose
choice the test decides per prompt. Everything above it (EvalTask, the metric templates, the
result table) is the real SDK with anonymous credentials.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from google.cloud.aiplatform_v1.services.evaluation_service import EvaluationServiceClient
from google.cloud.aiplatform_v1.types import evaluation_service as types


class FakeEvaluationService:
    """Answers pairwise requests with `choices[prompt]` (CANDIDATE, BASELINE or TIE), or
    `default` for a prompt not in `choices`."""

    def __init__(self, monkeypatch: Any, choices: dict[str, str], default: str = "") -> None:
        self.choices = choices
        self.default = default
        self.requests: list[Any] = []
        self._lock = threading.Lock()  # the SDK sends rows from a thread pool
        monkeypatch.setattr(
            EvaluationServiceClient,
            "evaluate_instances",
            lambda client, request=None, **kw: self.evaluate_instances(request),
        )

    def evaluate_instances(self, request: Any) -> Any:
        with self._lock:
            self.requests.append(request)
        instance = json.loads(request.pairwise_metric_input.instance.json_instance)
        choice = self.choices.get(instance["prompt"], self.default)
        return types.EvaluateInstancesResponse(
            pairwise_metric_result=types.PairwiseMetricResult(
                pairwise_choice=types.PairwiseChoice[choice],
                explanation=f"fake judge: {choice}",
            )
        )
