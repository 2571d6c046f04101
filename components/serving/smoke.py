"""The smoke test of a deployed model: one chat prompt (components/serving/presets.py) sent to a
Vertex endpoint, answered by the new model. `deploy_version` (endpoints.py) sends it before the
version keeps its share of traffic."""

from __future__ import annotations

import json
from typing import Any

from components.serving.presets import ServingPreset, chat_answer, chat_body

SMOKE_ATTEMPTS = 20
"""Chat requests sent before giving up (the new model is alone on the endpoint it is tested on;
the Model Garden preset's answers are still checked to come from it)."""


def smoke(
    predictions: Any,
    *,
    endpoint: str,
    preset: ServingPreset,
    served_model_name: str,
    deployed_model_id: str,
    attempts: int = SMOKE_ATTEMPTS,
) -> str:
    """Send the smoke chat prompt through `predictions` (the region's PredictionServiceClient,
    `VertexClients.predictions`); return the answer.

    Raises:
        RuntimeError: no chat completion came back (or, with the Model Garden preset, none from
            the new model).
    """
    # the Vertex client (~2 s to import) only when a cloud deployment is tested
    from google.api import httpbody_pb2
    from google.cloud import aiplatform_v1

    body = chat_body(preset, served_model_name)
    problems: list[str] = []
    for _ in range(attempts):
        try:
            if preset == "vertex-vllm":
                # Flattened arguments, as the SDK's Endpoint.predict calls it (proto-plus cannot
                # build a PredictRequest with Value instances in one go).
                response = predictions.predict(
                    endpoint=endpoint, instances=json.loads(body)["instances"]
                )
                predictions = [_plain(p) for p in response.predictions]
                answer = chat_answer({"predictions": predictions})
                if answer is not None and response.deployed_model_id == deployed_model_id:
                    return answer
                problems.append(
                    f"{response.deployed_model_id or '?'} answered {answer!r}"
                    if answer is not None
                    else f"no chat completion in {predictions!r:.200}"
                )
                continue
            http_body = httpbody_pb2.HttpBody(data=body, content_type="application/json")
            raw = predictions.raw_predict(
                request=aiplatform_v1.RawPredictRequest(endpoint=endpoint, http_body=http_body)
            )
            answer = chat_answer(bytes(raw.data))
            if answer is not None:
                return answer
            problems.append(f"no answer in {bytes(raw.data)[:200]!r}")
        except Exception as exc:  # a refused request is a failed smoke test, reported below
            problems.append(f"{type(exc).__name__}: {exc}")
        if len(problems) >= 3 and preset != "vertex-vllm":
            break
    raise RuntimeError(
        f"the smoke prompt got no answer from the new model on {endpoint}: "
        + "; ".join(problems[-3:])
    )


def _plain(value: Any) -> Any:
    """A prediction as plain Python (proto-plus gives Struct/list wrappers or protobuf Values)."""
    # protobuf's helpers: only for a Vertex answer
    from google.protobuf import json_format, struct_pb2

    if isinstance(value, struct_pb2.Value):
        return json_format.MessageToDict(value)
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "RepeatedComposite":
        return [_plain(v) for v in value]
    return value
