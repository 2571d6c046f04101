"""The Kubernetes ApiClient factory: in a pod, from a kubeconfig, or for a remote GKE cluster.

Which one, and why:
- `cluster="projects/P/locations/L/clusters/C"`: Vertex AI Pipelines drives a GKE cluster from
  outside it. The endpoint and CA come from the GKE API (google-cloud-container's
  `ClusterManagerClient.get_cluster`) and the bearer token from Application Default Credentials,
  refreshed when it expires; no kubeconfig or gcloud binary is needed in the image.
- otherwise, in a pod (KFP on GKE): the pod's service account (`load_incluster_config`);
- otherwise a kubeconfig (`kubeconfig`/`context`, or the default ~/.kube/config): a developer's shell.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import re
import tempfile
from typing import Any

CLUSTER_PATTERN = re.compile(r"^projects/[^/]+/locations/[^/]+/clusters/[^/]+$")
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def _write_ca(pem: bytes) -> str:
    """The client reads the CA from a file path only; the file lives as long as this process."""
    fd, path = tempfile.mkstemp(prefix="llmft-gke-ca-", suffix=".crt")
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)

    def remove() -> None:
        with contextlib.suppress(OSError):
            os.unlink(path)

    atexit.register(remove)
    return path


def gke_configuration(cluster: str, *, credentials: Any = None, cluster_manager: Any = None) -> Any:
    """A `kubernetes.client.Configuration` for a GKE cluster reached through its public endpoint.

    Args:
        cluster: `projects/P/locations/L/clusters/C`.
        credentials: google.auth credentials (default: Application Default Credentials).
        cluster_manager: a `container_v1.ClusterManagerClient` (default: one built from
            `credentials`); tests pass one that records the request.
    """
    if not CLUSTER_PATTERN.match(cluster):
        raise ValueError(
            f"gke cluster {cluster!r}: expected projects/PROJECT/locations/LOCATION/clusters/NAME"
        )
    import google.auth
    import google.auth.transport.requests
    from google.cloud import container_v1
    from kubernetes import client

    if credentials is None:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    manager = cluster_manager or container_v1.ClusterManagerClient(credentials=credentials)
    info = manager.get_cluster(request=container_v1.GetClusterRequest(name=cluster))
    if not info.endpoint:
        raise ValueError(f"gke cluster {cluster} has no endpoint yet (status {info.status.name})")

    def refresh_token(config: Any) -> None:
        if not credentials.valid:
            credentials.refresh(google.auth.transport.requests.Request())
        config.api_key["authorization"] = f"Bearer {credentials.token}"

    config = client.Configuration()
    config.host = f"https://{info.endpoint}"
    config.ssl_ca_cert = _write_ca(base64.b64decode(info.master_auth.cluster_ca_certificate))
    config.api_key = {}
    # Called before every request: tokens from google.auth last ~1 h, jobs run longer.
    config.refresh_api_key_hook = refresh_token
    refresh_token(config)
    return config


def make_api_client(
    *,
    cluster: str = "",
    kubeconfig: str | None = None,
    context: str | None = None,
    credentials: Any = None,
    cluster_manager: Any = None,
) -> Any:
    """A `kubernetes.client.ApiClient` for the cluster the run should use (see module docstring)."""
    from kubernetes import client, config

    if cluster:
        return client.ApiClient(
            gke_configuration(cluster, credentials=credentials, cluster_manager=cluster_manager)
        )
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    return config.new_client_from_config(config_file=kubeconfig, context=context)


def run_owner(api_client: Any, namespace: str) -> dict[str, Any] | None:
    """The ownerReference of this KFP run's Argo Workflow, when this process is a KFP task pod
    in `namespace`; else None.

    Per-run objects owned by the Workflow go away with the run even if its exit handler never
    ran (a terminated KFP run may skip it). KFP v2 sets KFP_POD_NAME in every task pod; owner
    references must stay within one namespace (across namespaces the garbage collector deletes
    the dependent at once), so objects in another namespace get no owner.
    """
    pod_name = os.environ.get("KFP_POD_NAME", "")
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as handle:
            pod_namespace = handle.read().strip()
    except OSError:
        pod_namespace = os.environ.get("KFP_POD_NAMESPACE", "")
    if not pod_name or pod_namespace != namespace:
        return None
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        pod = client.CoreV1Api(api_client).read_namespaced_pod(pod_name, namespace)
    except ApiException:
        return None
    for ref in pod.metadata.owner_references or []:
        if ref.kind == "Workflow":
            return {
                "apiVersion": ref.api_version,
                "kind": ref.kind,
                "name": ref.name,
                "uid": ref.uid,
            }
    return None
