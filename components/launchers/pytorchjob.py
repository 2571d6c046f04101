"""The PyTorchJob manifest (Kubeflow Training Operator v1): a pure builder, no cluster needed.

`build_pytorchjob(launch=..., options=PyTorchJobOptions(...))` returns a plain dict, validated in
tests against the CRD's openAPIV3Schema; `components/launchers/gke.py` submits and follows it.
Render one without a cluster: `llmft render pytorchjob --nodes 4 --nproc-per-node 4 ...`.

Design choices:
- Worker replicas only, with an elasticPolicy. A Worker-only elastic PyTorchJob is marked
  Succeeded as soon as one worker succeeds, so the launcher judges success from every replica,
  and cleanPodPolicy defaults to "None" so that the operator does not delete still-running
  workers (rank 0, which exports the model, need not be worker 0).
- torchrun's arguments are always passed explicitly in the command: the operator does not know the
  `etcd-v3` backend, and explicit flags pin the rendezvous id to the run id for every backend. For
  backends the operator knows (c10d, etcd, etcd-v2) the elasticPolicy says the same thing.
- Secrets (the HF token) come from a Kubernetes Secret by name (secretKeyRef, optional: public
  models need no token), never inline.
- `runPolicy.backoffLimit`: the operator (v1.9, `PastBackoffLimit`) fails the job once the
  container restarts summed over all running pods reach it (`sum >= limit`), so it is
  `restarts_per_node x nodes + 1`: every node may use its configured restarts, even all at once.
- Pods run as the image's user uid 1000 (the image runs as root: Dataflow's worker boot needs it).
- GPU pods get GKE's driver mount on the loader path (`GKE_NVIDIA_LIBRARY_PATH`, else pip torch
  sees no CUDA) and `LLMFT_EXPECT_CUDA=1`, so a trainer that still sees no GPU stops at once
  instead of training on CPU while the GPUs are billed (trainer/cuda_guard.py;
  `node_setup.gpu_env`).
- A multi-node job's pods must share one zone (`node_setup.same_zone_affinity`, a podAffinity on
  `topology.kubernetes.io/zone`): a regional GPU pool would otherwise spread them, and FSDP's
  collectives would cross zones every step (slower, and inter-zone egress is billed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.etcd.manifests import etcd_endpoint
from components.launchers.base import TORCHRUN_ENV, TrainLaunch
from components.launchers.node_setup import (
    GPUDIRECT_SETUPS,
    apply_patch,
    gpu_env,
    gpudirect_patch,
    same_zone_affinity,
)
from components.launchers.vocab import (
    DEFAULT_NAMESPACE,
    K8S_LABEL_NAME,
    K8S_SUBDOMAIN_NAME,
    KUEUE_QUEUE_LABEL,
)
from components.platform.capacity import CAPACITIES
from components.platform.node_facts import GPU_NODE_LABEL as GKE_ACCELERATOR_LABEL
from components.runtime.image import DEFAULT_IMAGE
from components.runtime.run_identity import k8s_labels, resource_name
from trainer.tracking import TOKEN_ENV

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
CONTAINER = "pytorch"
"""The operator requires the training container to be named `pytorch`."""
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_RDZV_BACKENDS = {"c10d", "etcd", "etcd-v2"}
DEFAULT_RDZV_PORT = {"c10d": 29400, "etcd-v2": 2379, "etcd-v3": 2379}
GPU_RESOURCE = "nvidia.com/gpu"
WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"
CLEAN_POD_POLICIES = ("None", "Running", "All")
RESTART_POLICIES = ("OnFailure", "Never", "Always", "ExitCode")
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


@dataclass(frozen=True)
class PyTorchJobOptions:
    """How the PyTorchJob of a launch runs on the cluster (everything but what to run)."""

    namespace: str = DEFAULT_NAMESPACE
    """Namespace of the job (and of the Secrets it reads)."""
    image: str = DEFAULT_IMAGE
    """The project image (pinned tag)."""
    accelerator: str | None = "nvidia-h100-80gb"
    """GKE accelerator (node label `cloud.google.com/gke-accelerator`); None for CPU-only pods."""
    gpus_per_node: int | None = None
    """GPUs per pod (default: nproc_per_node when an accelerator is set)."""
    cpu: str | None = None
    """CPU request = limit per pod (None leaves it unset)."""
    memory: str | None = None
    """Memory request = limit per pod (None leaves it unset)."""
    shm_size: str = "64Gi"
    """Size of the memory-backed /dev/shm (dataloader workers and NCCL need more than the 64 MiB
    default)."""
    service_account: str | None = None
    """Kubernetes service account bound to a Google service account through Workload Identity
    (reads gs://, writes outputs)."""
    hf_token_secret: str | None = None
    """Secret holding the Hugging Face token, `name` or `name:key` (key defaults to `token`);
    exposed as HF_TOKEN when the Secret exists (optional)."""
    secret_env: Mapping[str, str] = field(default_factory=dict)
    """More environment variables from Secrets, ENV -> `name[:key]` (required, but the MLflow
    token: optional)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Plain environment variables (nothing secret)."""
    min_nodes: int | None = None
    """Elastic lower bound (default: nodes, i.e. not elastic)."""
    restart_policy: str = "OnFailure"
    """Pod restart policy; OnFailure lets a crashed pod rejoin the rendezvous."""
    clean_pod_policy: str = "None"
    """Pods to delete when the job ends: None (keep for logs), Running or All."""
    ttl_seconds_after_finished: int | None = 86400
    """The operator deletes the finished job after this long (a backstop for when no cleanup
    runs)."""
    restarts_per_node: int | None = 3
    """Container restarts each node may use before the job is marked Failed;
    `runPolicy.backoffLimit` = this x nodes + 1 (`backoff_limit_for`). None: no limit."""
    owner: Mapping[str, Any] | None = None
    """An ownerReference (the run's Argo Workflow on KFP) so deleting the run deletes the job
    even when no cleanup step ran."""
    active_deadline_seconds: int | None = None
    """Hard limit on the job's run time."""
    gang_scheduling: bool = False
    """Schedule all pods together or none (needs a gang scheduler such as Volcano or
    scheduler-plugins configured in the operator)."""
    scheduling_queue: str | None = None
    """Gang scheduling's queue."""
    priority_class: str | None = None
    """Gang scheduling's priority class."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra labels for the job and its pods (the run's labels are always set)."""
    kueue_queue: str | None = None
    """Kueue LocalQueue (in `namespace`) that admits the job whole or not at all: the job gets
    the `kueue.x-k8s.io/queue-name` label and is created suspended; Kueue unsuspends it once
    quota for every pod is reserved. A PyTorchJob needs Kueue's `kubeflow.org/pytorchjob`
    integration enabled (off in Kueue's default configuration); a TrainJob's is on."""

    # --- capacity (components/platform/capacity.py) -----------------------------------------------------
    capacity: str = "on-demand"
    """on-demand; spot (node selector `cloud.google.com/gke-spot` + its toleration: a Spot node
    pool or Autopilot Spot Pods); flex-start (node selector `cloud.google.com/gke-flex-start`: a
    node pool with flex-start provisioning, GKE >= 1.32.2-gke.1652000)."""
    ephemeral_storage: str | None = None
    """The trainer's ephemeral-storage request (node_setup.ephemeral_storage_request): a pod goes
    only to a node whose disk holds its base model copy, not evicted after the GPUs are up (C6)."""
    gpudirect: str | None = None
    """"gpudirect-tcpx" (A3 High), "gpudirect-tcpxo" (A3 Mega) or "gpudirect-rdma" (A3 Ultra, A4):
    the pods use the pool's GPU NIC networks (launchers/node_setup.py; a pool set up by infra
    `gke.gpudirect`)."""
    termination_grace_s: int | None = None
    """The pods' terminationGracePeriodSeconds (time for the SIGTERM checkpoint); None: the
    Kubernetes default (30 s). A preempted Spot node gives pods at most GKE_SPOT_POD_GRACE_S
    whatever this says; a value below 30 s only shortens every other termination's checkpoint
    window (the train step never sets less: capacity.POD_TERMINATION_GRACE_S)."""

    def gpus(self, launch: TrainLaunch) -> int:
        """GPUs per pod: `gpus_per_node`, else one per process when an accelerator is set."""
        return launch.accelerators_per_node(self.gpus_per_node, self.accelerator)

    def errors(self, launch: TrainLaunch) -> list[str]:
        """Every problem with these options for `launch`, so the user fixes them in one go."""
        errors: list[str] = []
        if self.clean_pod_policy not in CLEAN_POD_POLICIES:
            errors.append(
                f"clean_pod_policy={self.clean_pod_policy!r}: choose one of {CLEAN_POD_POLICIES}"
            )
        if self.restart_policy not in RESTART_POLICIES:
            errors.append(
                f"restart_policy={self.restart_policy!r}: OnFailure, Never, Always or ExitCode"
            )
        min_nodes = min_nodes_of(launch, self)
        if not 1 <= min_nodes <= launch.nodes:
            errors.append(f"min_nodes={min_nodes}: must be between 1 and nodes={launch.nodes}")
        gpus = self.gpus(launch)
        if gpus and not self.accelerator:
            errors.append("gpus_per_node is set but accelerator is not: name the GKE accelerator")
        if self.accelerator and gpus and gpus < launch.nproc_per_node:
            errors.append(
                f"gpus_per_node={gpus} < nproc_per_node={launch.nproc_per_node}: one process "
                "per GPU"
            )

        if self.capacity not in CAPACITIES:
            errors.append(f"capacity={self.capacity!r}: choose one of {', '.join(CAPACITIES)}")
        if self.termination_grace_s is not None and self.termination_grace_s < 0:
            errors.append(f"termination_grace_s={self.termination_grace_s}: cannot be negative")
        if self.gpudirect and (self.gpudirect not in GPUDIRECT_SETUPS or not gpus):
            errors.append(
                f"gpudirect={self.gpudirect!r}: one of {', '.join(GPUDIRECT_SETUPS)}, on GPU pods"
            )
        if (self.scheduling_queue or self.priority_class) and not self.gang_scheduling:
            errors.append("scheduling_queue/priority_class need gang_scheduling=True")
        if self.kueue_queue and self.gang_scheduling:
            errors.append("kueue_queue and gang_scheduling: Kueue admits the job whole; choose one")
        if self.kueue_queue and not re.fullmatch(K8S_LABEL_NAME[0], self.kueue_queue):
            errors.append(f"kueue_queue={self.kueue_queue!r} is not {K8S_LABEL_NAME[1]}")
        for name, ref in self.secrets().items():
            secret, key = parse_secret_ref(ref)
            if not re.fullmatch(K8S_SUBDOMAIN_NAME[0], secret):
                errors.append(f"secret for {name}: {secret!r} is not {K8S_SUBDOMAIN_NAME[1]}")
            if not re.fullmatch(r"[-._a-zA-Z0-9]+", key):
                errors.append(
                    f"secret key for {name}: {key!r} is not a Secret key ([-._a-zA-Z0-9])"
                )
        return errors + _kubernetes_value_errors(self)

    def secrets(self) -> dict[str, str]:
        """Environment variables from Secrets, ENV -> `name[:key]` (the HF token included)."""
        hf_token = {"HF_TOKEN": self.hf_token_secret} if self.hf_token_secret else {}
        return {**self.secret_env, **hf_token}


def min_nodes_of(launch: TrainLaunch, options: PyTorchJobOptions) -> int:
    return launch.nodes if options.min_nodes is None else options.min_nodes


def build_pytorchjob(
    *, launch: TrainLaunch, options: PyTorchJobOptions | None = None
) -> dict[str, Any]:
    """The PyTorchJob for `launch`: `launch.nodes` Worker pods x `launch.nproc_per_node` processes.

    Args:
        launch: what to run (model, data, output as gs:// URIs; rendezvous; trainer overrides).
            An empty `rdzv_endpoint` means: etcd backends -> the run's etcd Service
            (components/etcd/kubernetes.py); c10d -> worker 0's Service.
        options: how it runs on the cluster (default `PyTorchJobOptions()`).

    Returns:
        The manifest as a dict (apply it with the Kubernetes client or `kubectl apply -f`).

    Raises:
        ValueError: every problem of the launch and the options, in one message.
    """
    options = options or PyTorchJobOptions()
    launch.validate()
    errors = options.errors(launch)
    if errors:
        raise ValueError("invalid PyTorchJob options:\n  - " + "\n  - ".join(errors))

    name = job_name(launch.run_id)
    run_labels = {**options.labels, **k8s_labels(launch.run_id, "trainer")}
    endpoint = rendezvous_endpoint(launch, options.namespace)
    job_labels = dict(run_labels)
    if options.kueue_queue:  # on the job only: Kueue reads it there, the pods need not carry it
        job_labels[KUEUE_QUEUE_LABEL] = options.kueue_queue
    metadata: dict[str, Any] = {"name": name, "namespace": options.namespace, "labels": job_labels}
    if options.owner:
        metadata["ownerReferences"] = [dict(options.owner)]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "nprocPerNode": str(launch.nproc_per_node),
            "elasticPolicy": _elastic_policy(launch, options, endpoint),
            "runPolicy": _run_policy(launch, options),
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": launch.nodes,
                    "restartPolicy": options.restart_policy,
                    "template": _template(launch, options, endpoint, run_labels),
                }
            },
        },
    }


def _template(
    launch: TrainLaunch, options: PyTorchJobOptions, endpoint: str, labels: dict[str, str]
) -> dict[str, Any]:
    """The Worker pod template: labels, the pod spec, and the GPUDirect setup when asked for."""
    template = {"metadata": {"labels": dict(labels)}, "spec": _pod_spec(launch, options, endpoint)}
    if options.gpudirect:
        apply_patch(template, CONTAINER, gpudirect_patch(options.gpudirect, options.gpus(launch)))
    return template


def rendezvous_endpoint(launch: TrainLaunch, namespace: str) -> str:
    """The launch's endpoint, else the run's etcd Service, else (c10d) worker 0's Service."""
    if launch.rdzv_endpoint:
        return launch.rdzv_endpoint
    if launch.rdzv_backend == "c10d":
        return f"{job_name(launch.run_id)}-worker-0:{DEFAULT_RDZV_PORT['c10d']}"

    return etcd_endpoint(run_id=launch.run_id, namespace=namespace)


def _container(launch: TrainLaunch, options: PyTorchJobOptions, endpoint: str) -> dict[str, Any]:
    """The `pytorch` container: torchrun with explicit flags, env, Secrets, resources."""
    gpus = options.gpus(launch)
    return {
        "name": CONTAINER,
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": torchrun_command(launch, endpoint, min_nodes_of(launch, options)),
        "env": container_env(options, gpus),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "resources": container_resources(options, gpus),
    }


def torchrun_command(launch: TrainLaunch, endpoint: str, min_nodes: int) -> list[str]:
    """`python -m torch.distributed.run` with every flag explicit, then the trainer (both APIs)."""
    torchrun = launch.torchrun_args(endpoint)
    if min_nodes != launch.nodes:
        torchrun[0] = f"--nnodes={min_nodes}:{launch.nodes}"
    return [
        "python",
        "-m",
        "torch.distributed.run",
        *torchrun,
        *launch.entrypoint,
        *launch.trainer_args(),
    ]


def container_env(options: PyTorchJobOptions, gpus: int) -> list[dict[str, Any]]:
    """The training container's env: torchrun's, the GPU pod's, the options', then Secrets by
    reference (secretKeyRef; the HF and MLflow tokens optional), never a value."""
    env: list[dict[str, Any]] = [
        {"name": key, "value": value}
        for key, value in {**TORCHRUN_ENV, **gpu_env(gpus), **options.env}.items()
    ]
    for env_name, ref in options.secrets().items():
        secret, key = parse_secret_ref(ref)
        key_ref: dict[str, Any] = {"name": secret, "key": key}
        if (env_name == "HF_TOKEN" and ref == options.hf_token_secret) or env_name == TOKEN_ENV:
            # Like the task pods': public models need no token, and a missing MLflow token is
            # the tracking's warning (never a pod that cannot start after preprocessing ran).
            key_ref["optional"] = True
        env.append({"name": env_name, "valueFrom": {"secretKeyRef": key_ref}})
    return env


def container_resources(options: PyTorchJobOptions, gpus: int) -> dict[str, Any]:
    """GPU limits, and cpu/memory requests = limits where set."""
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if gpus:
        limits[GPU_RESOURCE] = gpus
    if options.cpu:
        limits["cpu"] = requests["cpu"] = options.cpu
    if options.memory:
        limits["memory"] = requests["memory"] = options.memory
    if options.ephemeral_storage:
        # A request only: the scheduler needs it; a limit would evict a pod that overshoots.
        requests["ephemeral-storage"] = options.ephemeral_storage
    return {k: v for k, v in (("limits", limits), ("requests", requests)) if v}


def _pod_spec(launch: TrainLaunch, options: PyTorchJobOptions, endpoint: str) -> dict[str, Any]:
    """Each worker pod: the container, /dev/shm, the image's user, the GPU node pool."""
    return {
        "containers": [_container(launch, options, endpoint)],
        "volumes": [shm_volume(options)],
        **pod_placement(launch, options),
    }


def shm_volume(options: PyTorchJobOptions) -> dict[str, Any]:
    """The memory-backed /dev/shm, `dshm`."""
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": options.shm_size}}


def pod_placement(launch: TrainLaunch, options: PyTorchJobOptions) -> dict[str, Any]:
    """A training pod's user, service account, GPU pool, zone and capacity (both APIs')."""
    pod_spec: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "fsGroup": IMAGE_UID,
        },
    }
    if options.service_account:
        pod_spec["serviceAccountName"] = options.service_account
    if options.accelerator:
        pod_spec["nodeSelector"] = {GKE_ACCELERATOR_LABEL: options.accelerator}
        pod_spec["tolerations"] = [
            {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
        ]
    if launch.nodes > 1:
        pod_spec["affinity"] = same_zone_affinity(launch.run_id)
    schedule_capacity(pod_spec, options)
    return pod_spec


# --- capacity: Spot and flex-start nodes, the termination grace period --------------------------

GKE_SPOT_LABEL = "cloud.google.com/gke-spot"
"""Node label (and taint key, where the node pool is tainted) of GKE Spot VMs
(cloud.google.com/kubernetes-engine/docs/how-to/spot-vms)."""
GKE_FLEX_START_LABEL = "cloud.google.com/gke-flex-start"
"""Node label of flex-start nodes (cloud.google.com/kubernetes-engine/docs/how-to/
dws-flex-start-training)."""


def schedule_capacity(pod_spec: dict[str, Any], options: PyTorchJobOptions) -> None:
    """Select Spot or flex-start nodes (tolerating the Spot taint), and set the grace period."""
    label = {"spot": GKE_SPOT_LABEL, "flex-start": GKE_FLEX_START_LABEL}.get(options.capacity)
    if label:
        pod_spec.setdefault("nodeSelector", {})[label] = "true"
    if options.capacity == "spot":
        pod_spec.setdefault("tolerations", []).append(
            {"key": GKE_SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        )
    if options.termination_grace_s is not None:
        pod_spec["terminationGracePeriodSeconds"] = options.termination_grace_s


def _elastic_policy(
    launch: TrainLaunch, options: PyTorchJobOptions, endpoint: str
) -> dict[str, Any]:
    """The operator's view of the rendezvous (only for the backends it knows)."""
    elastic: dict[str, Any] = {
        "minReplicas": min_nodes_of(launch, options),
        "maxReplicas": launch.nodes,
        "maxRestarts": launch.max_restarts,
        "rdzvId": launch.rdzv_id,
    }
    if launch.rdzv_backend in OPERATOR_RDZV_BACKENDS:
        host, _, port = endpoint.rpartition(":")
        elastic |= {"rdzvBackend": launch.rdzv_backend, "rdzvHost": host, "rdzvPort": int(port)}
    return elastic


def _run_policy(launch: TrainLaunch, options: PyTorchJobOptions) -> dict[str, Any]:
    """Clean-up, TTL, restart budget, deadline and gang scheduling of the job."""
    run_policy: dict[str, Any] = {"cleanPodPolicy": options.clean_pod_policy}
    if options.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = options.ttl_seconds_after_finished
    if options.restarts_per_node is not None:
        run_policy["backoffLimit"] = backoff_limit_for(launch.nodes, options.restarts_per_node)
    if options.active_deadline_seconds is not None:
        run_policy["activeDeadlineSeconds"] = options.active_deadline_seconds
    if options.kueue_queue:
        run_policy["suspend"] = True  # Kueue's webhook would set it; Kueue unsuspends on admission
    if options.gang_scheduling:
        policy: dict[str, Any] = {"minAvailable": min_nodes_of(launch, options)}
        if options.scheduling_queue:
            policy["queue"] = options.scheduling_queue
        if options.priority_class:
            policy["priorityClass"] = options.priority_class
        run_policy["schedulingPolicy"] = policy
    return run_policy


_QUANTITY = r"[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?"
"""A Kubernetes resource quantity (1, 500m, 64Gi, 1.5, 2e3), the API server's grammar."""


def _kubernetes_value_errors(options: PyTorchJobOptions) -> list[str]:
    """Names, quantities and durations the API server would reject (or that would be wrong)."""
    errors = []
    if not re.fullmatch(K8S_LABEL_NAME[0], options.namespace):
        errors.append(f"namespace={options.namespace!r} is not {K8S_LABEL_NAME[1]}")
    account = options.service_account
    if account and not re.fullmatch(K8S_SUBDOMAIN_NAME[0], account):
        errors.append(f"service_account={account!r} is not {K8S_SUBDOMAIN_NAME[1]}")
    quantities = (("cpu", options.cpu), ("memory", options.memory), ("shm_size", options.shm_size))
    for name, quantity in quantities:
        if quantity is not None and not re.fullmatch(_QUANTITY, str(quantity)):
            errors.append(
                f"{name}={quantity!r} is not a Kubernetes quantity such as 8, 500m or 64Gi"
            )
    deadline = options.active_deadline_seconds
    if deadline is not None and deadline < 1:
        errors.append(f"active_deadline_seconds={deadline}: must be at least 1")
    for name in ("ttl_seconds_after_finished", "restarts_per_node"):
        value = getattr(options, name)
        if value is not None and value < 0:
            errors.append(f"{name}={value}: cannot be negative")
    return errors
