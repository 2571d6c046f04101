"""The cleanup of a failed or cancelled run on Vertex AI endpoints: what its deploy step could not
roll back itself (killed before its undeploy finished) is found by the run's labels and names and
removed. Run by the cleanup step (components/steps/cleanup.py)."""

from __future__ import annotations

from components.runtime.run_identity import resource_name, vertex_labels
from components.serving.endpoints import DEPLOY_TIMEOUT_S, VertexClients, undeploy
from components.serving.traffic import rescaled


def undeploy_run(clients: VertexClients, *, project: str, location: str, run_id: str) -> list[str]:
    """Undeploy every deployed model this run deployed (display name `llmft-serve-<run>`) from the
    endpoints of `project`/`location`, and delete the endpoints the run created that serve nothing
    else: the cleanup of a failed or cancelled run whose deploy step could not roll back (killed
    before its undeploy finished). Returns what was removed."""
    # the Vertex client (~2 s to import) only when a cloud run is cleaned up
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    mine = resource_name("serve", run_id)
    run_label = vertex_labels(run_id)
    removed = []
    endpoints = clients.endpoints.list_endpoints(
        request=aiplatform_v1.ListEndpointsRequest(
            parent=f"projects/{project}/locations/{location}"
        )
    )
    for endpoint in endpoints:
        ours = [d.id for d in endpoint.deployed_models if d.display_name == mine]
        for deployed_id in ours:
            rest = {k: v for k, v in endpoint.traffic_split.items() if k != deployed_id and v > 0}
            total = sum(rest.values())
            split = rescaled(rest) if total else {}
            try:
                undeploy(clients, endpoint.name, deployed_id, split)
                removed.append(f"deployed model {deployed_id} on {endpoint.name}")
            except exceptions.NotFound:
                pass
        created_here = all(endpoint.labels.get(k) == v for k, v in run_label.items())
        others = [d for d in endpoint.deployed_models if d.id not in ours]
        if created_here and not others:
            try:
                clients.endpoints.delete_endpoint(request={"name": endpoint.name}).result(
                    timeout=DEPLOY_TIMEOUT_S
                )
                removed.append(f"endpoint {endpoint.name}")
            except exceptions.NotFound:
                pass
    return removed
