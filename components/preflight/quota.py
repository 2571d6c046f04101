"""Quota before money: what a run will ask Google Cloud for, read against the project's granted
quota through the Cloud Quotas API, before anything starts (cloud audit 2026-12-07, C1).

A fresh project has little or no GPU quota. Without this check a Vertex CustomJob fails at
provisioning after Dataflow was paid for, and a GKE PyTorchJob waits for nodes the autoscaler
cannot add. `llmft run` (pipelines/cli/run.py) and the validate step of a console run
(components/steps/validate.py) call `quota_check(params)`:

- `needs_for(params)`: the quotas the run counts against, per step (training GPUs on Vertex AI
  or on the GKE pool's Compute Engine quota, by capacity type; the evaluate task's GPU on Vertex
  AI; Dataflow's worker vCPUs). The facts (metric names, sources) are in
  components/platform/quota_facts.py. Steps run one after another, so a metric's need is its
  largest step's.
- `read_quota_infos`: one `quotaInfos.list` per service through `AuthorizedSession` (REST, no
  extra client library), all pages.
- A need above its grant is an error naming the quota, the region, what is granted, what the run
  needs and where to ask for more. A quota that cannot be read (no credentials, 403) is a
  warning naming the role that reads it; the run is not refused for what cannot be known.

The granted value is the limit, not what other jobs use right now (Cloud Quotas has no usage:
that is Cloud Monitoring's), so a pass means "could fit", not "will start at once".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from components.platform import quota_facts as facts
from components.platform.platform_facts import machine

log = logging.getLogger(__name__)

PAGE_SIZE = 1000
"""quotaInfos.list page size (the server may return fewer; every page is read)."""
PREEMPTIBLE_CAPACITY = ("spot", "flex-start")
"""Capacity types that count against the preemptible GPU quota (quota_facts sources)."""


@dataclass(frozen=True)
class QuotaNeed:
    """One quota a run counts against, and how much of it the run needs."""

    service: str
    metric: str
    """Full metric name (`aiplatform.googleapis.com/custom_model_training_nvidia_h100_gpus`)."""
    region: str
    amount: int
    what: str
    """What asks for it, for the message ("training: 2 nodes x 8 NVIDIA_H100_80GB")."""
    gpu_family: str = ""
    """Compute Engine GPUs: also bounded by GPUS-PER-GPU-FAMILY for this family."""
    hard: bool = True
    """False: short quota slows the run down (Dataflow autoscales within it) but does not stop it."""


@dataclass
class QuotaReport:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def region_of(location: str) -> str:
    """`us-central1-a` -> `us-central1`; a region stays itself."""
    parts = location.split("-")
    return "-".join(parts[:2]) if len(parts) > 2 else location


def needs_for(params: Any) -> list[QuotaNeed]:
    """The quotas a run of `params` (RunParams) counts against on Google Cloud; empty for a run
    that uses none (local backend and DirectRunner)."""
    needs: list[QuotaNeed] = []
    preemptible = params.capacity in PREEMPTIBLE_CAPACITY
    gpus = params.nodes * params.accelerator_count
    training = (
        f"training: {params.nodes} nodes x {params.accelerator_count} {params.accelerator_type}"
    )
    if params.backend == "vertex" and params.accelerator_type and gpus and not params.reservation:
        # A reservation is consumed instead of on-demand quota: nothing to check here.
        metric = facts.vertex_gpu_metric(params.accelerator_type, preemptible=preemptible)
        needs.append(QuotaNeed(facts.VERTEX_SERVICE, metric, params.region, gpus, training))
    if params.backend == "gke" and params.accelerator_type and gpus:
        region = region_of(_cluster_location(params.gke_cluster) or params.region)
        metric = facts.compute_gpu_metric(params.accelerator_type, preemptible=preemptible)
        family = "" if preemptible else facts.compute_gpu_family(params.accelerator_type)
        needs.append(QuotaNeed(facts.COMPUTE_SERVICE, metric, region, gpus, training, family))
        # The project-wide GPU quota bounds GKE's nodes too; a fresh project often has 0 there.
        needs.append(
            QuotaNeed(facts.COMPUTE_SERVICE, facts.GPUS_ALL_REGIONS_METRIC, facts.GLOBAL, gpus,
                      training)
        )  # fmt: skip
    if params.backend in ("vertex", "gke") and params.eval_accelerator_type:
        # The evaluate task: a Vertex Pipelines task with an accelerator runs as custom training;
        # on KFP it lands on the GKE GPU pool (already counted above by node).
        count = params.eval_accelerator_count
        if params.backend == "vertex" and count:
            metric = facts.vertex_gpu_metric(params.eval_accelerator_type, preemptible=False)
            what = f"evaluate: {count} {params.eval_accelerator_type}"
            needs.append(QuotaNeed(facts.VERTEX_SERVICE, metric, params.region, count, what))
    if params.preprocess_runner == "DataflowRunner":
        options = params.dataflow_options or {}
        worker = machine(str(options.get("machine_type") or facts.DATAFLOW_DEFAULT_MACHINE))
        vcpus = worker.vcpus if worker else 1
        name = options.get("machine_type") or facts.DATAFLOW_DEFAULT_MACHINE
        needs.append(
            QuotaNeed(facts.COMPUTE_SERVICE, facts.CPUS_METRIC, params.region, vcpus,
                      f"preprocess: one Dataflow worker ({name})")
        )  # fmt: skip
        if most := int(options.get("max_num_workers") or 0):
            needs.append(
                QuotaNeed(facts.COMPUTE_SERVICE, facts.CPUS_METRIC, params.region, most * vcpus,
                          f"preprocess: {most} Dataflow workers ({name})", hard=False)
            )  # fmt: skip
    return _largest_per_quota(needs)


def _cluster_location(gke_cluster: str) -> str:
    parts = gke_cluster.split("/")
    return parts[parts.index("locations") + 1] if "locations" in parts[:-1] else ""


def _largest_per_quota(needs: list[QuotaNeed]) -> list[QuotaNeed]:
    """Steps run one after another: per (metric, region, hardness) the largest need counts."""
    largest: dict[tuple[str, str, bool], QuotaNeed] = {}
    for need in needs:
        key = (need.metric, need.region, need.hard)
        if key not in largest or need.amount > largest[key].amount:
            largest[key] = need
    return list(largest.values())


# --- reading the granted quota ----------------------------------------------------------------------


class QuotaUnreadable(Exception):
    """The quota could not be read (no credentials, permission, API off): a warning, not a stop."""


def read_quota_infos(session: Any, project: str, service: str) -> list[dict[str, Any]]:
    """Every QuotaInfo of `service` in `project` (quotaInfos.list, all pages).

    Raises:
        QuotaUnreadable: the API answered with an error (403: the caller lacks the permission or
            the API is off), saying what would let it be read.
    """
    url = (
        f"{facts.CLOUD_QUOTAS_ENDPOINT}/projects/{project}/locations/global/services/"
        f"{service}/quotaInfos"
    )
    infos: list[dict[str, Any]] = []
    token = ""
    while True:
        query = {"pageSize": str(PAGE_SIZE)} | ({"pageToken": token} if token else {})
        response = session.get(url, params=query, timeout=30)
        if response.status_code != 200:
            raise QuotaUnreadable(_unreadable(response, project, service))
        body = response.json()
        infos += body.get("quotaInfos", [])
        token = body.get("nextPageToken", "")
        if not token:
            return infos


def _http_why(response: Any) -> str:
    """`HTTP <status>: <the error's message>` of a Google API error answer."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:200]
    return f"HTTP {response.status_code}: {message}"


def _unreadable(response: Any, project: str, service: str) -> str:
    why = _http_why(response)
    if response.status_code == 403 and "quota project" in why:
        # User credentials without a quota project (gcloud's ADC login): some APIs refuse them.
        return (
            f"cannot read the {service} quota of {project} ({why}): run `gcloud auth "
            f"application-default set-quota-project {project}`"
        )
    if response.status_code == 403:
        return (
            f"cannot read the {service} quota of {project} ({why}): grant "
            f"{facts.QUOTA_VIEWER_ROLE} ({facts.QUOTA_READ_PERMISSION}) to the caller, and enable "
            "cloudquotas.googleapis.com"
        )
    return f"cannot read the {service} quota of {project} ({why})"


def granted(infos: Iterable[dict[str, Any]], need: QuotaNeed) -> tuple[int, str] | None:
    """(granted value, quota id) binding `need` (the smallest that applies), or None when the
    project lists no such quota."""
    found: list[tuple[int, str]] = []
    for info in infos:
        if info.get("metric") == need.metric:
            value = _value_in(info, need.region, {})
        elif need.gpu_family and info.get("quotaId") == facts.GPU_FAMILY_QUOTA_ID:
            value = _value_in(info, need.region, {"gpu_family": need.gpu_family})
        else:
            continue
        if value is not None:
            found.append((value, str(info.get("quotaId", need.metric))))
    limited = [f for f in found if f[0] >= 0]
    return min(limited) if limited else (found[0] if found else None)


def _value_in(info: dict[str, Any], region: str, wanted: dict[str, str]) -> int | None:
    """The value in effect for `region` (and `wanted` service dimensions): the first
    dimensionsInfo that applies, the list being ordered from the most specific."""
    for dims in info.get("dimensionsInfos", []):
        dimensions = dims.get("dimensions", {})
        locations = dims.get("applicableLocations", [])
        if dimensions.get("region", region) != region:
            continue
        if locations and region not in locations and "global" not in locations:
            continue
        if any(dimensions.get(k, v) != v for k, v in wanted.items()):
            continue
        value = dims.get("details", {}).get("value")
        return int(value) if value is not None else 0
    return None


def check_quota(
    needs: list[QuotaNeed], project: str, read: Callable[[str], list[dict[str, Any]]]
) -> QuotaReport:
    """Compare `needs` with the grants `read(service)` returns (QuotaInfos)."""
    report = QuotaReport()
    infos: dict[str, list[dict[str, Any]] | None] = {}
    for need in needs:
        if need.service not in infos:
            try:
                infos[need.service] = read(need.service)
            except QuotaUnreadable as exc:
                infos[need.service] = None
                report.warnings.append(f"quota not checked: {exc}")
        service_infos = infos[need.service]
        if service_infos is None:
            continue
        grant = granted(service_infos, need)
        if grant is None:
            report.warnings.append(
                f"quota not checked: {project} lists no {need.metric} quota in {need.region} "
                f"({need.what})"
            )
            continue
        value, quota_id = grant
        if value < 0 or value >= need.amount:
            continue
        line = (
            f"quota {need.metric} ({quota_id}) in {need.region} is {value}, the run needs "
            f"{need.amount} ({need.what}): ask for more at "
            f"{facts.QUOTA_CONSOLE.format(project=project)} (docs/deploy/README.md, 'GPU quota')"
        )
        (report.errors if need.hard else report.warnings).append(line)
    return report


def local_credentials() -> bool:
    """Whether Application Default Credentials are configured on this machine (the environment
    variable or gcloud's ADC file), without asking a metadata server: a dry run reads quota
    only then, so that it stays instant offline."""
    import os

    from google.auth import _cloud_sdk

    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return True
    return os.path.exists(_cloud_sdk.get_application_default_credentials_path())


def default_session() -> Any:
    """An AuthorizedSession with Application Default Credentials.

    Raises:
        QuotaUnreadable: no credentials here.
    """
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from google.auth.transport.requests import AuthorizedSession

    try:
        credentials, _ = google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-platform"]
        )
    except DefaultCredentialsError as exc:
        raise QuotaUnreadable(f"no Google Cloud credentials ({str(exc).split('. ')[0]})") from None
    return AuthorizedSession(credentials)


SESSION_FACTORY: Callable[[], Any] = default_session
"""How `quota_check` gets its HTTP session (tests put a recording fake here)."""


def quota_check(params: Any, session: Any = None) -> QuotaReport:
    """The run's quota needs checked against the project's grants (see the module docstring)."""
    needs = needs_for(params)
    if not needs:
        return QuotaReport()
    try:
        session = session or SESSION_FACTORY()
    except QuotaUnreadable as exc:
        return QuotaReport(warnings=[f"quota not checked: {exc}"])
    project = params.project

    def read(service: str) -> list[dict[str, Any]]:
        try:
            return read_quota_infos(session, project, service)
        except QuotaUnreadable:
            raise
        except Exception as exc:  # transport: refresh errors, connection failures
            raise QuotaUnreadable(f"cannot read the {service} quota of {project} ({exc})") from None

    report = check_quota(needs, project, read)
    pools = pool_check(params, session)
    report.errors += pools.errors
    report.warnings += pools.warnings
    return report


# --- the GKE GPU pool's size ------------------------------------------------------------------------


def pool_check(params: Any, session: Any) -> QuotaReport:
    """GKE: whether the cluster's pools of the run's machine type can grow to `params.nodes` in
    one zone (a multi-node PyTorchJob keeps its pods in one zone: launchers/pytorchjob.py
    `same_zone_affinity`). A pool too small leaves the job Pending for nodes the autoscaler is
    not allowed to add, the same 30-minute loss as missing quota (cloud round-4 review Q3)."""
    cluster = params.gke_cluster
    if params.backend != "gke" or not cluster or not params.accelerator_type:
        return QuotaReport()
    try:
        response = session.get(f"{facts.GKE_ENDPOINT}/{cluster}/nodePools", timeout=30)
    except Exception as exc:  # transport: refresh errors, connection failures
        return QuotaReport(warnings=[f"node pool not checked: cannot read {cluster} ({exc})"])
    if response.status_code != 200:
        return QuotaReport(
            warnings=[
                f"node pool not checked: cannot read the node pools of {cluster} "
                f"({_http_why(response)}): {facts.CLUSTER_VIEWER_ROLE} reads them"
            ]
        )
    pools = [
        pool
        for pool in response.json().get("nodePools", [])
        if pool.get("config", {}).get("machineType") == params.machine_type
    ]
    if not pools:
        return QuotaReport(
            warnings=[
                f"node pool not checked: {cluster} has no {params.machine_type} pool (only node "
                "auto-provisioning could add one)"
            ]
        )
    most = max(pool_max_nodes(pool) for pool in pools)
    if most >= params.nodes:
        return QuotaReport()
    return QuotaReport(
        errors=[
            f"node pool: the {params.machine_type} pools of {cluster} grow to at most {most} "
            f"nodes in a zone, the run needs {params.nodes}: raise the pool's maximum (infra "
            f"setting gke.gpu_max_nodes) or pass --param nodes={most}"
        ]
    )


def pool_max_nodes(pool: dict[str, Any]) -> int:
    """The most nodes a pool can have in one zone: its autoscaling maximum (per zone; the total
    when only that is set), or its fixed size without autoscaling."""
    autoscaling = pool.get("autoscaling", {})
    if autoscaling.get("enabled"):
        return int(autoscaling.get("maxNodeCount") or autoscaling.get("totalMaxNodeCount") or 0)
    return int(pool.get("initialNodeCount", 0))
