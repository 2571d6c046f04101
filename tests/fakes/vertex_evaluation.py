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

from google.api_core import exceptions
from google.cloud.aiplatform_v1.services.evaluation_service import EvaluationServiceClient
from google.cloud.aiplatform_v1.types import evaluation_service as types


class FakeEvaluationService:
    """Answers pairwise requests with `choices[prompt]` (CANDIDATE, BASELINE or TIE), or
    `default` for a prompt not in `choices`; refuses the prompts in `denied` with the 403 the
    service returns without `aiplatform.endpoints.predict`."""

    def __init__(
        self,
        monkeypatch: Any,
        choices: dict[str, str],
        default: str = "",
        denied: frozenset[str] = frozenset(),
    ) -> None:
        self.choices = choices
        self.default = default
        self.denied = denied
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
        if instance["prompt"] in self.denied:
            raise exceptions.PermissionDenied("Permission 'aiplatform.endpoints.predict' denied")
        choice = self.choices.get(instance["prompt"], self.default)
        return types.EvaluateInstancesResponse(
            pairwise_metric_result=types.PairwiseMetricResult(
                pairwise_choice=types.PairwiseChoice[choice],
                explanation=f"fake judge: {choice}",
            )
        )
