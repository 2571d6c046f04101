"""GKE backend: the run as a Kubeflow Training Operator v1 PyTorchJob.

`build_pytorchjob` is the one keyword-only builder of the manifest (a plain dict, validated in tests
against the CRD's openAPIV3Schema); `GkeLauncher` creates it idempotently, follows it (status
conditions, the rank-0 pod's log, pod failure reasons), deletes it on SIGTERM and cleans up by
label. Render one without a cluster: `llmft render pytorchjob --nodes 4 --nproc-per-node 4 ...`.

Design choices:
- Worker replicas only, with an elasticPolicy. A Worker-only elastic PyTorchJob is marked
  Succeeded as soon as one worker succeeds, so success is judged here from every replica (each
  worker pod succeeded), and cleanPodPolicy defaults to "None" so that the operator does not delete
  still-running workers (rank 0, which exports the model, need not be worker 0).
- torchrun's arguments are always passed explicitly in the command: the operator does not know the
  `etcd-v3` backend, and explicit flags pin the rendezvous id to the run id for every backend. For
  backends the operator knows (c10d, etcd, etcd-v2) the elasticPolicy says the same thing.
- Secrets (the HF token) come from a Kubernetes Secret by name (secretKeyRef, optional: public
  models need no token), never inline.
- `runPolicy.backoffLimit`: the operator (v1.9, `PastBackoffLimit`) fails the job once the
  container restarts summed over all running pods reach it (`sum >= limit`), so it is
  `restarts_per_node x nodes + 1`: every node may use its configured restarts, even all at once.
- The job is followed with a watch that resumes from the last resourceVersion (a 410 Gone lists
  again); each quiet watch window re-checks the pods. A job the operator marks Succeeded while a
  worker still runs or restarts is failed after `succeeded_grace_s` (or at once when that worker
  is crash-looping) instead of being waited on forever.
- Pods run as the image's unprivileged user (uid 1000): the image itself runs as root because
  Dataflow's worker boot needs it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from components.image import DEFAULT_IMAGE
from components.launchers.base import (
    CANCELLED,
    FAILED,
    SUCCEEDED,
    TORCHRUN_ENV,
    Launcher,
    LaunchResult,
    LogSink,
    TrainLaunch,
)
from components.launchers.k8s_diagnostics import (
    PodProblem,
    event_problems,
    pod_problems,
    summarize,
)
from components.run_identity import k8s_labels, k8s_selector, resource_name
from components.run_params import K8S_LABEL_NAME, K8S_SUBDOMAIN_NAME, RunParams

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
CONTAINER = "pytorch"
"""The operator requires the training container to be named `pytorch`."""
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_RDZV_BACKENDS = {"c10d", "etcd", "etcd-v2"}
DEFAULT_RDZV_PORT = {"c10d": 29400, "etcd-v2": 2379, "etcd-v3": 2379}
GPU_RESOURCE = "nvidia.com/gpu"
WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
CLEAN_POD_POLICIES = ("None", "Running", "All")


IMAGE_UID = 1000
"""The unprivileged user the Dockerfile creates (`llmft`)."""


def backoff_limit_for(nodes: int, restarts_per_node: int) -> int:
    """`runPolicy.backoffLimit` giving each node `restarts_per_node` container restarts.

    Training Operator v1.9 sums `restartCount` over the containers of all running pods of the job
    and fails it when `sum >= backoffLimit`; a limit of `restarts_per_node` alone would let four
    flaky nodes share what one node was meant to have.
    """
    return nodes * restarts_per_node + 1


def job_name(run_id: str) -> str:
    return resource_name("train", run_id)


def parse_secret_ref(ref: str) -> tuple[str, str]:
    """`name` or `name:key` (key defaults to `token`) -> (secret name, key)."""
    name, _, key = ref.partition(":")
    return name, key or "token"


def build_pytorchjob(
    *,
    launch: TrainLaunch,
    namespace: str = RunParams.namespace,
    image: str = DEFAULT_IMAGE,
    accelerator: str | None = "nvidia-h100-80gb",
    gpus_per_node: int | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    shm_size: str = "64Gi",
    service_account: str | None = None,
    hf_token_secret: str | None = None,
    secret_env: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    min_nodes: int | None = None,
    restart_policy: str = "OnFailure",
    clean_pod_policy: str = "None",
    ttl_seconds_after_finished: int | None = 86400,
    restarts_per_node: int | None = 3,
    owner: Mapping[str, Any] | None = None,
    active_deadline_seconds: int | None = None,
    gang_scheduling: bool = False,
    scheduling_queue: str | None = None,
    priority_class: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The PyTorchJob for `launch`: `launch.nodes` Worker pods x `launch.nproc_per_node` processes.

    Args:
        launch: what to run (model, data, output as gs:// URIs; rendezvous; trainer overrides).
            An empty `rdzv_endpoint` means: etcd backends -> the run's etcd Service
            (components/etcd/kubernetes.py); c10d -> worker 0's Service.
        namespace: namespace of the job (and of the Secrets it reads).
        image: the project image (pinned tag).
        accelerator: GKE accelerator (node label `cloud.google.com/gke-accelerator`), e.g.
            "nvidia-h100-80gb"; None for CPU-only pods.
        gpus_per_node: GPUs per pod (default: nproc_per_node when an accelerator is set).
        cpu, memory: requests = limits per pod (None leaves them unset).
        shm_size: size of the memory-backed /dev/shm (dataloader workers and NCCL need more than
            the 64 MiB default).
        service_account: Kubernetes service account bound to a Google service account through
            Workload Identity (reads gs://, writes outputs).
        hf_token_secret: Secret holding the Hugging Face token, `name` or `name:key` (key
            defaults to `token`); exposed as HF_TOKEN when the Secret exists (optional).
        secret_env: more environment variables from Secrets, ENV -> `name[:key]` (required).
        env: plain environment variables (nothing secret).
        min_nodes: elastic lower bound (default: nodes, i.e. not elastic).
        restart_policy: pod restart policy; OnFailure lets a crashed pod rejoin the rendezvous.
        clean_pod_policy: pods to delete when the job ends: None (keep for logs), Running or All.
        ttl_seconds_after_finished: the operator deletes the finished job after this long (a
            backstop for when no cleanup runs).
        restarts_per_node: container restarts each node may use before the job is marked
            Failed; `runPolicy.backoffLimit` = this x nodes + 1 (`backoff_limit_for`). None: no
            limit.
        owner: an ownerReference (the run's Argo Workflow on KFP) so deleting the run deletes
            the job even when no cleanup step ran.
        active_deadline_seconds: hard limit on the job's run time.
        gang_scheduling: schedule all pods together or none (needs a gang scheduler such as
            Volcano or scheduler-plugins configured in the operator).
        scheduling_queue, priority_class: gang scheduling's queue and priority class.
        labels: extra labels for the job and its pods (the run's labels are always set).

    Returns:
        The manifest as a dict (apply it with the Kubernetes client or `kubectl apply -f`).
    """
    launch.validate()
    errors: list[str] = []
    if clean_pod_policy not in CLEAN_POD_POLICIES:
        errors.append(f"clean_pod_policy={clean_pod_policy!r}: choose one of {CLEAN_POD_POLICIES}")
    if restart_policy not in ("OnFailure", "Never", "Always", "ExitCode"):
        errors.append(f"restart_policy={restart_policy!r}: OnFailure, Never, Always or ExitCode")
    min_nodes = launch.nodes if min_nodes is None else min_nodes
    if not 1 <= min_nodes <= launch.nodes:
        errors.append(f"min_nodes={min_nodes}: must be between 1 and nodes={launch.nodes}")
    gpus = (
        gpus_per_node
        if gpus_per_node is not None
        else (launch.nproc_per_node if accelerator else 0)
    )
    if gpus and not accelerator:
        errors.append("gpus_per_node is set but accelerator is not: name the GKE accelerator")
    if accelerator and gpus and gpus < launch.nproc_per_node:
        errors.append(
            f"gpus_per_node={gpus} < nproc_per_node={launch.nproc_per_node}: one process per GPU"
        )
    if (scheduling_queue or priority_class) and not gang_scheduling:
        errors.append("scheduling_queue/priority_class need gang_scheduling=True")
    for name, ref in {
        **({"HF_TOKEN": hf_token_secret} if hf_token_secret else {}),
        **(secret_env or {}),
    }.items():
        secret, key = parse_secret_ref(ref)
        if not re.fullmatch(K8S_SUBDOMAIN_NAME[0], secret):
            errors.append(f"secret for {name}: {secret!r} is not {K8S_SUBDOMAIN_NAME[1]}")
        if not re.fullmatch(r"[-._a-zA-Z0-9]+", key):
            errors.append(f"secret key for {name}: {key!r} is not a Secret key ([-._a-zA-Z0-9])")
    errors += _kubernetes_value_errors(
        namespace=namespace, service_account=service_account, cpu=cpu, memory=memory,
        shm_size=shm_size, active_deadline_seconds=active_deadline_seconds,
        ttl_seconds_after_finished=ttl_seconds_after_finished, restarts_per_node=restarts_per_node,
    )  # fmt: skip
    if errors:
        raise ValueError("invalid PyTorchJob options:\n  - " + "\n  - ".join(errors))

    name = job_name(launch.run_id)
    run_labels = {**(labels or {}), **k8s_labels(launch.run_id, "trainer")}
    port = DEFAULT_RDZV_PORT[launch.rdzv_backend]
    if launch.rdzv_endpoint:
        endpoint = launch.rdzv_endpoint
    elif launch.rdzv_backend == "c10d":
        endpoint = f"{name}-worker-0:{port}"
    else:
        from components.etcd.kubernetes import etcd_endpoint

        endpoint = etcd_endpoint(run_id=launch.run_id, namespace=namespace)
    host, _, port_text = endpoint.rpartition(":")

    torchrun = launch.torchrun_args(endpoint)
    if min_nodes != launch.nodes:
        torchrun[0] = f"--nnodes={min_nodes}:{launch.nodes}"
    command = [
        "python", "-m", "torch.distributed.run", *torchrun, *launch.entrypoint,
        *launch.trainer_args(),
    ]  # fmt: skip

    container_env: list[dict[str, Any]] = [
        {"name": key, "value": value} for key, value in {**TORCHRUN_ENV, **(env or {})}.items()
    ]
    secrets = {**(secret_env or {}), **({"HF_TOKEN": hf_token_secret} if hf_token_secret else {})}
    for env_name, ref in secrets.items():
        secret, key = parse_secret_ref(ref)
        key_ref: dict[str, Any] = {"name": secret, "key": key}
        if env_name == "HF_TOKEN" and ref == hf_token_secret:
            key_ref["optional"] = True  # like the task pods': public models need no token
        container_env.append({"name": env_name, "valueFrom": {"secretKeyRef": key_ref}})

    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if gpus:
        limits[GPU_RESOURCE] = gpus
    if cpu:
        limits["cpu"] = requests["cpu"] = cpu
    if memory:
        limits["memory"] = requests["memory"] = memory
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": container_env,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "resources": {k: v for k, v in (("limits", limits), ("requests", requests)) if v},
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "fsGroup": IMAGE_UID,
        },
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if accelerator:
        pod_spec["nodeSelector"] = {GKE_ACCELERATOR_LABEL: accelerator}
        pod_spec["tolerations"] = [
            {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
        ]

    elastic: dict[str, Any] = {
        "minReplicas": min_nodes,
        "maxReplicas": launch.nodes,
        "maxRestarts": launch.max_restarts,
        "rdzvId": launch.rdzv_id,
    }
    if launch.rdzv_backend in OPERATOR_RDZV_BACKENDS:
        elastic |= {
            "rdzvBackend": launch.rdzv_backend,
            "rdzvHost": host,
            "rdzvPort": int(port_text),
        }

    run_policy: dict[str, Any] = {"cleanPodPolicy": clean_pod_policy}
    if ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = ttl_seconds_after_finished
    if restarts_per_node is not None:
        run_policy["backoffLimit"] = backoff_limit_for(launch.nodes, restarts_per_node)
    if active_deadline_seconds is not None:
        run_policy["activeDeadlineSeconds"] = active_deadline_seconds
    if gang_scheduling:
        policy: dict[str, Any] = {"minAvailable": min_nodes}
        if scheduling_queue:
            policy["queue"] = scheduling_queue
        if priority_class:
            policy["priorityClass"] = priority_class
        run_policy["schedulingPolicy"] = policy

    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": run_labels}
    if owner:
        metadata["ownerReferences"] = [dict(owner)]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "nprocPerNode": str(launch.nproc_per_node),
            "elasticPolicy": elastic,
            "runPolicy": run_policy,
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": launch.nodes,
                    "restartPolicy": restart_policy,
                    "template": {"metadata": {"labels": dict(run_labels)}, "spec": pod_spec},
                }
            },
        },
    }


_QUANTITY = r"[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?"
"""A Kubernetes resource quantity (1, 500m, 64Gi, 1.5, 2e3), the API server's grammar."""


def _kubernetes_value_errors(
    *,
    namespace: str,
    service_account: str | None,
    cpu: str | None,
    memory: str | None,
    shm_size: str,
    active_deadline_seconds: int | None,
    ttl_seconds_after_finished: int | None,
    restarts_per_node: int | None,
) -> list[str]:
    """Names, quantities and durations the API server would reject (or that would be wrong)."""
    errors = []
    if not re.fullmatch(K8S_LABEL_NAME[0], namespace):
        errors.append(f"namespace={namespace!r} is not {K8S_LABEL_NAME[1]}")
    if service_account and not re.fullmatch(K8S_SUBDOMAIN_NAME[0], service_account):
        errors.append(f"service_account={service_account!r} is not {K8S_SUBDOMAIN_NAME[1]}")
    for name, quantity in (("cpu", cpu), ("memory", memory), ("shm_size", shm_size)):
        if quantity is not None and not re.fullmatch(_QUANTITY, str(quantity)):
            errors.append(
                f"{name}={quantity!r} is not a Kubernetes quantity such as 8, 500m or 64Gi"
            )
    if active_deadline_seconds is not None and active_deadline_seconds < 1:
        errors.append(f"active_deadline_seconds={active_deadline_seconds}: must be at least 1")
    for name, value in (("ttl_seconds_after_finished", ttl_seconds_after_finished),
                        ("restarts_per_node", restarts_per_node)):  # fmt: skip
        if value is not None and value < 0:
            errors.append(f"{name}={value}: cannot be negative")
    return errors


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """YAML for `kubectl apply -f`: no anchors, and strings that YAML 1.2 (kubectl) would read as
    numbers (`2e-05`, `1000` in a command) are quoted so they stay strings."""
    import re

    import yaml

    number = re.compile(
        r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|0x[0-9a-fA-F]+|0o[0-7]+"
    )

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    def represent_str(dumper: yaml.SafeDumper, value: str) -> Any:
        style = "'" if number.fullmatch(value) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, represent_str)
    return str(yaml.dump(dict(manifest), Dumper=Dumper, sort_keys=False))


def _condition(job: Mapping[str, Any]) -> tuple[str, str, str]:
    """The latest true condition: (type, reason, message); ("", "", "") before the first."""
    conditions = [
        c for c in job.get("status", {}).get("conditions") or [] if c.get("status") == "True"
    ]
    if not conditions:
        return "", "", ""
    last = conditions[-1]
    return last.get("type", ""), last.get("reason", ""), last.get("message", "")


_FAILING_REASONS = {"CrashLoopBackOff", "Error", "OOMKilled", "ContainerCannotRun"}
"""Container states that mean a worker is failing (restarting after a non-zero exit)."""


class _JobGone(RuntimeError):
    """The PyTorchJob disappeared while it was followed (deleted by a user or by cleanup)."""


@dataclass
class _Follow:
    """The log follower of the rank-0 pod's current container."""

    key: tuple[str, int] = ("", -1)
    thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)


class GkeLauncher(Launcher):
    """Runs a PyTorchJob on a GKE (or any Kubernetes) cluster with the Training Operator.

    Args:
        api_client: a `kubernetes.client.ApiClient`; default `components.k8s_client.make_api_client`
            (in-cluster, `cluster`, or kubeconfig).
        cluster: remote GKE cluster `projects/P/locations/L/clusters/C` (from Vertex Pipelines).
        namespace: where the job runs.
        job_options: keyword arguments of `build_pytorchjob` (image, accelerator, ...).
        watch_s: length of one watch window: the job is watched from its last resourceVersion
            and, when quiet for this long, its pods are re-checked (unschedulable, crash loops).
        pending_timeout_s: fail when a pod stays unschedulable this long (a GPU node pool that
            cannot scale up otherwise keeps the run pending until activeDeadlineSeconds).
        succeeded_grace_s: how long workers may still run after the operator marked the job
            Succeeded (an elastic job is Succeeded when any worker is) before the run fails.
        follow_logs: stream the rank-0 pod's log to the log sink.
    """

    backend = "gke"

    def __init__(
        self,
        *,
        api_client: Any = None,
        cluster: str = "",
        namespace: str = RunParams.namespace,
        job_options: Mapping[str, Any] | None = None,
        watch_s: float = 60.0,
        pending_timeout_s: float = 1800.0,
        succeeded_grace_s: float = 600.0,
        follow_logs: bool = True,
        log: LogSink | None = None,
    ) -> None:
        super().__init__(log=log)
        if api_client is None:
            from components.k8s_client import make_api_client

            api_client = make_api_client(cluster=cluster)
        from kubernetes import client

        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.job_options = dict(job_options or {})
        self.watch_s = watch_s
        self.pending_timeout_s = pending_timeout_s
        self.succeeded_grace_s = succeeded_grace_s
        self.follow_logs = follow_logs
        self.name = ""
        self.manifest: dict[str, Any] = {}
        self._follow = _Follow()
        self._cancelled = False

    # ---- start --------------------------------------------------------------------------------

    def start(self, launch: TrainLaunch) -> None:
        self.launch = launch
        self.manifest = build_pytorchjob(
            launch=launch, namespace=self.namespace, **self.job_options
        )
        self.name = self.manifest["metadata"]["name"]
        self.check_service_account(self.job_options.get("service_account"))
        from components.k8s_client import run_owner

        owner = run_owner(self.api_client, self.namespace)
        if owner and "owner" not in self.job_options:
            self.manifest["metadata"]["ownerReferences"] = [owner]  # gone with the KFP run
        created = self.create(self.manifest)
        uid = (created.get("metadata") or {}).get("uid")
        if launch.rdzv_backend in ("etcd-v3", "etcd-v2") and uid:
            from components.etcd.kubernetes import adopt_etcd

            job_ref = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": self.name,
                "uid": uid,
            }
            if adopt_etcd(
                self.api_client, run_id=launch.run_id, namespace=self.namespace, owner=job_ref
            ):
                self.log(f"[gke] the run's etcd now belongs to PyTorchJob {self.name} (its TTL)")

    def check_service_account(self, name: str | None) -> None:
        """The pods' Kubernetes service account must exist (else the operator's pods never get
        created) and should carry a Workload Identity annotation (else gs:// access is 403)."""
        from kubernetes.client.exceptions import ApiException

        account = name or "default"
        try:
            found = self.core.read_namespaced_service_account(account, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise ValueError(
                    f"Kubernetes service account {self.namespace}/{account} does not exist: "
                    "create it and bind it to a Google service account with Workload Identity "
                    "(docs/deploy/rbac.yaml), or set service_account"
                ) from None
            if exc.status == 403:
                return  # not allowed to look: the pods will tell
            raise
        annotations = (found.metadata.annotations or {}) if found.metadata else {}
        if WORKLOAD_IDENTITY_ANNOTATION not in annotations:
            self.log(
                f"[gke] warning: service account {self.namespace}/{account} has no "
                f"{WORKLOAD_IDENTITY_ANNOTATION} annotation: reading gs:// will fail with 403 "
                "unless the node's service account may"
            )

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the job; if it exists (a retried step), reuse it unless it already failed, in
        which case it is replaced so the retry can succeed."""
        from kubernetes.client.exceptions import ApiException

        name = manifest["metadata"]["name"]
        try:
            created = self._create(manifest)
            self.log(f"[gke] created PyTorchJob {self.namespace}/{name}")
            return created
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = self._get(name)
        kind, reason, _ = _condition(existing)
        if kind != "Failed":
            self.log(
                f"[gke] PyTorchJob {self.namespace}/{name} already exists ({kind or 'new'}): "
                "following it"
            )
            return existing
        self.log(f"[gke] PyTorchJob {name} exists and failed ({reason}): replacing it")
        self._delete(name)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                return self._create(manifest)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            time.sleep(1.0)
        raise RuntimeError(f"PyTorchJob {name} was deleted but is still there after 120 s")

    def _create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return dict(
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, manifest
            )
        )

    def _get(self, name: str) -> dict[str, Any]:
        return dict(
            self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        )

    def _delete(self, name: str, namespace: str | None = None) -> bool:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace or self.namespace, PLURAL, name,
                body=client.V1DeleteOptions(propagation_policy="Background"),
            )  # fmt: skip
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    # ---- wait ---------------------------------------------------------------------------------

    def _pods(self) -> list[Any]:
        return list(
            self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{JOB_NAME_LABEL}={self.name}"
            ).items
        )

    def _events(self, pods: list[Any]) -> list[Any]:
        events: list[Any] = []
        for pod in pods:
            events += self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={pod.metadata.name}"
            ).items
        return events

    def diagnose(self, pods: list[Any] | None = None) -> list[PodProblem]:
        """Every problem of the job's pods, from their status and their Warning events."""
        pods = self._pods() if pods is None else pods
        problems = [p for pod in pods for p in pod_problems(pod)]
        return problems + event_problems(self._events(pods))

    def job_updates(self) -> Generator[dict[str, Any], None, None]:
        """The job now, then after every change: one list, then watches resumed from the last
        resourceVersion (a 410 Gone lists again). A watch window that ends quietly yields the
        last state again so the caller re-checks pods and deadlines."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        selector = f"metadata.name={self.name}"
        job: dict[str, Any] = {}
        version = ""
        while True:
            if not version:
                listing = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, field_selector=selector
                )
                version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
                items = listing.get("items") or []
                if not items:
                    raise _JobGone(self.name)
                job = items[0]
                yield job
            try:
                for event in watch.Watch().stream(
                    self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                    PLURAL, field_selector=selector, resource_version=version,
                    timeout_seconds=max(1, int(self.watch_s)), allow_watch_bookmarks=True,
                ):  # fmt: skip
                    obj = event["object"]
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                    if event["type"] == "DELETED":
                        raise _JobGone(self.name)
                    if event["type"] != "BOOKMARK":
                        job = obj
                        yield job
            except ApiException as exc:
                if exc.status != 410:
                    raise
                version = ""  # too old to resume from: list again
                continue
            yield job

    def wait(self, *, timeout: float | None = None) -> LaunchResult:
        if self.launch is None or not self.name:
            raise RuntimeError("start() a run before wait()")
        launch = self.launch
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        pending_since: float | None = None
        succeeded_since: float | None = None
        last_phase = ""
        status, message, details = FAILED, "", {}
        updates = self.job_updates()
        try:
            for job in updates:
                phase, reason, text = _condition(job)
                if phase != last_phase:
                    self.log(
                        f"[gke] {self.name}: {phase or 'Pending'}"
                        + (f" ({reason})" if reason else "")
                    )
                    last_phase = phase
                pods = self._pods()
                self._maybe_follow(pods)
                workers = job.get("status", {}).get("replicaStatuses", {}).get("Worker", {})
                details = {"job": self.name, "condition": phase, "replicas": workers}
                if phase == "Failed":
                    problems = self.diagnose(pods)
                    message = f"PyTorchJob {self.name} failed: {reason}: {text}".rstrip(": ")
                    if problems:
                        message += f"; {summarize(problems)}"
                    break
                if self._all_succeeded(workers, pods, launch.nodes):
                    status, message = SUCCEEDED, f"all {launch.nodes} workers succeeded"
                    break
                problems = [p for pod in pods for p in pod_problems(pod)]
                if phase == "Succeeded":
                    # A Worker-only elastic job is "Succeeded" once any worker succeeds.
                    failed_pods = [
                        p.metadata.name for p in pods if p.status and p.status.phase == "Failed"
                    ]
                    unfinished = [
                        p.metadata.name for p in pods if p.status and p.status.phase != "Succeeded"
                    ]
                    failing = [p for p in problems if p.reason in _FAILING_REASONS]
                    succeeded_since = succeeded_since or time.monotonic()
                    waited = time.monotonic() - succeeded_since
                    if failed_pods or failing or waited > self.succeeded_grace_s:
                        what = (
                            f"worker pod(s) {', '.join(failed_pods)} failed"
                            if failed_pods
                            else f"worker pod(s) {', '.join(unfinished)} did not finish"
                            + (
                                " (failing)"
                                if failing
                                else f" within {self.succeeded_grace_s:.0f}s"
                            )
                        )
                        message = (
                            f"PyTorchJob {self.name} is marked Succeeded but {what}; "
                            f"{summarize(self.diagnose(pods))}"
                        )
                        self._delete(self.name)
                        break
                fatal = [p for p in problems if p.fatal]
                if fatal:
                    message = f"PyTorchJob {self.name} cannot run: {summarize(fatal)}"
                    self._delete(self.name)
                    break
                unschedulable = [p for p in problems if p.reason == "Unschedulable"]
                if unschedulable:
                    pending_since = pending_since or time.monotonic()
                    if time.monotonic() - pending_since > self.pending_timeout_s:
                        events = event_problems(self._events(pods))
                        message = (
                            f"PyTorchJob {self.name} unschedulable for over "
                            f"{self.pending_timeout_s:.0f}s: {summarize(unschedulable + events)}"
                        )
                        self._delete(self.name)
                        break
                else:
                    pending_since = None
                if deadline is not None and time.monotonic() > deadline:
                    message = f"timed out after {timeout:.0f}s; deleted PyTorchJob {self.name}"
                    self._delete(self.name)
                    break
                if self._cancelled:
                    status, message = CANCELLED, "cancelled"
                    break
        except _JobGone:
            status = CANCELLED if self._cancelled else FAILED
            message = f"PyTorchJob {self.namespace}/{self.name} was deleted while running"
        finally:
            updates.close()
            self._stop_follow()
        return LaunchResult(
            run_id=launch.run_id, backend=self.backend, status=status, output=launch.output,
            message=message, duration_s=time.monotonic() - started, details=details,
        )  # fmt: skip

    @staticmethod
    def _all_succeeded(workers: Mapping[str, Any], pods: list[Any], nodes: int) -> bool:
        """Every replica succeeded: by the operator's count, or by the pods when it lags."""
        if int(workers.get("succeeded") or 0) >= nodes and not int(workers.get("failed") or 0):
            active = [p for p in pods if p.status and p.status.phase in ("Pending", "Running")]
            return not active
        done = [p for p in pods if p.status and p.status.phase == "Succeeded"]
        return len(done) >= nodes and len(done) == len(pods)

    # ---- logs ---------------------------------------------------------------------------------

    def _maybe_follow(self, pods: list[Any]) -> None:
        """Follow worker 0's container (again after each restart) while it runs."""
        if not self.follow_logs:
            return
        first = [p for p in pods if (p.metadata.labels or {}).get(REPLICA_INDEX_LABEL) == "0"]
        if (
            not first
            or first[0].status is None
            or first[0].status.phase not in ("Running", "Succeeded", "Failed")
        ):
            return
        pod = first[0]
        restarts = sum(c.restart_count or 0 for c in pod.status.container_statuses or [])
        key = (pod.metadata.uid or pod.metadata.name, restarts)
        if key == self._follow.key or (self._follow.thread and self._follow.thread.is_alive()):
            return
        self._follow = _Follow(key=key)
        self._follow.thread = threading.Thread(
            target=self._stream_log, args=(pod.metadata.name, self._follow.stop), daemon=True
        )
        self._follow.thread.start()

    def _stream_log(self, pod: str, stop: threading.Event) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.read_namespaced_pod_log(
                pod, self.namespace, container=CONTAINER, follow=True, _preload_content=False
            )
            buffer = b""
            for chunk in response.stream(4096):
                if stop.is_set():
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self.log(f"[{pod}] {line.decode(errors='replace')}")
            if buffer and not stop.is_set():
                self.log(f"[{pod}] {buffer.decode(errors='replace')}")
            response.release_conn()
        except (ApiException, OSError) as exc:  # logs are best effort; status decides the result
            self.log(f"[gke] log stream of {pod} ended: {exc}")

    def _stop_follow(self) -> None:
        self._follow.stop.set()
        if self._follow.thread is not None:
            self._follow.thread.join(timeout=5)

    # ---- cancel and cleanup -------------------------------------------------------------------

    def cancel(self) -> None:
        self._cancelled = True
        if self.name and self._delete(self.name):
            self.log(f"[gke] deleted PyTorchJob {self.namespace}/{self.name}")

    def cleanup(self, run_id: str) -> list[str]:
        """Delete the run's PyTorchJobs (by label) and its etcd objects; 404s are ignored."""
        removed: list[str] = []
        jobs = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, label_selector=k8s_selector(run_id)
        )
        for item in jobs.get("items", []):
            name = item["metadata"]["name"]
            if self._delete(name, item["metadata"].get("namespace")):
                removed.append(f"PyTorchJob {self.namespace}/{name}")
        removed += _cleanup_etcd(self.api_client, run_id, self.namespace)
        return removed


def _cleanup_etcd(api_client: Any, run_id: str, namespace: str) -> list[str]:
    """The run's etcd StatefulSet/Service/PVCs, deleted by label (components/etcd/kubernetes.py)."""
    from components.etcd.kubernetes import delete_etcd

    return [f"etcd {obj}" for obj in delete_etcd(api_client, run_id=run_id, namespace=namespace)]
