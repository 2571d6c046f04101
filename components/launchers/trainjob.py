"""The TrainJob manifest (Kubeflow Trainer v2, `trainer.kubeflow.org/v1alpha1`) and the
ClusterTrainingRuntime it references: pure builders, no cluster needed.

`build_trainjob(launch=..., options=PyTorchJobOptions(...))` returns a plain dict, validated in
tests against the v2.3.0 CRD's openAPIV3Schema and its CEL rules (tests/test_trainjob_manifest.py);
`components/launchers/gke.py` submits and follows it (`job_api="trainjob"`). Render one without a
cluster: `llmft render trainjob --nodes 4 --nproc-per-node 4 ...`; the runtimes infra installs:
`llmft render trainjob --runtimes` (docs/deploy/trainjob-runtimes.yaml).

The job options are the PyTorchJob's (`PyTorchJobOptions`: one set of cluster settings whichever
API runs the job); the few that only the Training Operator v1 has are refused here when set to
something the TrainJob cannot do (`trainjob_errors`).

Sources (kubeflow/trainer at v2.3.0): pkg/apis/trainer/v1alpha1/trainjob_types.go (the API),
pkg/runtime/framework/plugins/torch/torch.go (what the torch plugin sets),
pkg/runtime/framework/plugins/jobset/{jobset,builder}.go (how `spec.trainer` and runtimePatches
reach the JobSet), pkg/runtime/core/trainingruntime.go (labels), pkg/controller/
trainjob_controller.go (status, suspend, activeDeadlineSeconds).

Design choices:
- Our own versioned ClusterTrainingRuntime (`llmft-torch-v1-r<restarts>`), not
  `torch-distributed` with overrides: a TrainJob can patch only a restricted pod spec
  (runtimePatches: service account, volumes, node selector, affinity, tolerations, security
  context, grace period, container volumeMounts) and `spec.trainer` (image, command, env,
  resources, numNodes, numProcPerNode). The restart policy, the Job's backoffLimit and the
  JobSet's failurePolicy/successPolicy cannot be set per job, and torch-distributed leaves them
  to JobSet's defaults, which the chart may change; the run's restart budget is exactly what
  these decide. The name carries a version (a changed runtime is a new object, so a job in flight
  never sees its runtime change under it) and the restart budget (`failurePolicy.maxRestarts`
  cannot be patched, so each budget the train step uses is its own runtime: RUNTIME_RESTARTS).
- Restarts: `restartPolicy: Never`, `backoffLimit: 0`, and JobSet `failurePolicy.maxRestarts`:
  a failed or preempted pod fails its Job, and JobSet recreates every node's pod together (a
  fresh rendezvous on the run's etcd; the trainer resumes from its last checkpoint). torchrun's
  own `--max-restarts` still restarts crashed worker processes inside a pod first.
- Success: JobSet's default successPolicy (`All`) with one Indexed Job of `numNodes`
  completions, so the TrainJob's `Complete` condition means every node's pod exited 0 (unlike a
  Worker-only elastic PyTorchJob, which is Succeeded when any worker is).
- torchrun keeps its explicit flags (nnodes, nproc-per-node, rendezvous backend, endpoint, id,
  max-restarts): the torch plugin also injects PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR/PORT, which torchrun reads only as defaults for flags not given (and
  MASTER_ADDR/PORT and NODE_RANK only with the static rendezvous, which we never use). Our env
  must not name them: the plugin's validating webhook refuses TrainJobs that do.
- The TrainJob's own labels do not reach the JobSet or pods (trainingruntime.go takes the
  propagated labels from the runtime template and runtimePatches only): the run's labels go on
  the pods through our runtimePatch, so the zone affinity, cleanup by label and `kubectl get pods
  -l llmft.dev/run=...` see them.
- Env for the `node` container can only come through `spec.trainer.env` (the JobSet plugin
  refuses runtimePatches env on `node`); the HF token is a secretKeyRef there, never inline.
- GPUDirect (`options.gpudirect`, A3 High/Mega/Ultra, A4): a runtime variant per setup,
  `llmft-torch-v1-r<restarts>-<tcpx|tcpxo|rdma>`, whose pod template carries the setup's pod
  patch (launchers/node_setup.py: the NIC network annotations, the volumes, the trainer's
  mounts and, for TCPX/TCPXO, the receive-data-path daemon beside it), while the job's
  `spec.trainer` carries the setup's NCCL env and the command that sources the plugin's settings.
  Not runtimePatches: in v2.3.0's TrainJob CRD a runtimePatch's `containers[]` and
  `initContainers[]` items have only name, env, securityContext and volumeMounts (no image or
  command: a daemon container cannot be added, and an unknown field is pruned), though its pod
  metadata takes annotations and its pod spec volumes. One mechanism for the three setups (RDMA
  alone would fit in a runtimePatch). The daemon's device annotation lists 8 GPUs: every
  GPUDirect machine carries 8 (platform_facts), and a GPUDirect TrainJob must use them all.
- With a Kueue queue the job is created suspended (Kueue's documented TrainJob form; its webhook
  would set it anyway) and Kueue unsuspends it once the whole job is admitted.
"""

from __future__ import annotations

from typing import Any

from components.etcd.manifests import etcd_endpoint
from components.launchers.base import TrainLaunch
from components.launchers.node_setup import GPUDIRECT_SETUPS, apply_patch, gpudirect_patch
from components.launchers.pytorchjob import (
    PyTorchJobOptions,
    container_env,
    container_resources,
    job_name,
    pod_placement,
    shm_volume,
    torchrun_command,
)
from components.launchers.vocab import KUEUE_QUEUE_LABEL
from components.platform.capacity import SPOT_RESTARTS_PER_NODE
from components.runtime.image import DEFAULT_IMAGE
from components.runtime.run_identity import k8s_labels

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
RUNTIME_KIND, RUNTIME_PLURAL = "ClusterTrainingRuntime", "clustertrainingruntimes"
CONTAINER = "node"
"""The trainer container and replicated Job name the torch plugin and `spec.trainer` act on
(pkg/constants/constants.go `Node`)."""
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
"""JobSet labels every pod with its JobSet's name, which is the TrainJob's (examples/yaml/
02-runtime-patches.yaml: `kubectl get pods -l jobset.sigs.k8s.io/jobset-name=...`)."""
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
"""The node index of an Indexed Job's pod (Kubernetes >= 1.28)."""
PATCH_MANAGER = "llmft.dev/gke-launcher"
"""Our runtimePatch's key (a domain-prefixed path: the JobSet plugin validates it)."""
RESERVED_ENV = frozenset(
    {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
)
"""torch.go: `TorchRunReservedEnvNames`; a TrainJob whose trainer env names one is refused."""
C10D_PORT = 29400
RUNTIME_VERSION = "v1"
"""Bump when the runtime's template changes (a new object; jobs in flight keep theirs)."""
RUNTIME_TTL_S = 86400
"""JobSet ttlSecondsAfterFinished: finished pods (and their logs) go a day later."""


def runtime_restarts() -> tuple[int, ...]:
    """The restart budgets infra installs a runtime for: the default and the Spot one
    (components/platform/capacity.py), as `PyTorchJobOptions.restarts_per_node` takes them."""
    default = PyTorchJobOptions.restarts_per_node
    assert default is not None
    return tuple(sorted({default, SPOT_RESTARTS_PER_NODE}))


GPUDIRECT_GPUS = 8
"""GPUs of every GPUDirect machine (a3-highgpu-8g, a3-megagpu-8g, a3-ultragpu-8g, a4-highgpu-8g):
the GPUDirect runtimes' device list; a GPUDirect TrainJob uses all of them."""


def runtime_name(restarts: int, gpudirect: str | None = None) -> str:
    """`llmft-torch-v1-r<restarts>`, with `-tcpx`/`-tcpxo`/`-rdma` for a GPUDirect setup."""
    suffix = f"-{gpudirect.removeprefix('gpudirect-')}" if gpudirect else ""
    return f"llmft-torch-{RUNTIME_VERSION}-r{restarts}{suffix}"


def build_cluster_training_runtime(
    *, restarts: int, image: str = DEFAULT_IMAGE, gpudirect: str | None = None
) -> dict[str, Any]:
    """The ClusterTrainingRuntime with `restarts` whole-job restarts (infra installs one per
    `runtime_restarts()`, and with a GPUDirect pool one per restarts for its setup; the job
    overrides image, command, env, resources and pod placement). `gpudirect`: the pod template
    carries that setup's patch except the trainer's env and command (the job's `spec.trainer`)."""
    pod: dict[str, Any] = {
        "spec": {"restartPolicy": "Never", "containers": [{"name": CONTAINER, "image": image}]}
    }
    if gpudirect:
        patch = gpudirect_patch(gpudirect, GPUDIRECT_GPUS)
        patch.env, patch.command_prefix = {}, ""
        apply_patch(pod, CONTAINER, patch)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": RUNTIME_KIND,
        "metadata": {
            "name": runtime_name(restarts, gpudirect),
            "labels": {
                "trainer.kubeflow.org/framework": "torch",
                "app.kubernetes.io/part-of": "llmft",
            },
        },
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "failurePolicy": {"maxRestarts": restarts},
                    "ttlSecondsAfterFinished": RUNTIME_TTL_S,
                    "replicatedJobs": [
                        {
                            "name": CONTAINER,
                            "template": {
                                "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                                "spec": {
                                    "backoffLimit": 0,
                                    "template": pod,
                                },
                            },
                        }
                    ],
                }
            },
        },
    }


def trainjob_errors(launch: TrainLaunch, options: PyTorchJobOptions) -> list[str]:
    """What a TrainJob cannot do of these options (on top of `options.errors`)."""
    errors = []
    if options.min_nodes is not None and options.min_nodes != launch.nodes:
        errors.append(
            f"min_nodes={options.min_nodes}: a TrainJob is not elastic (Trainer v2.3 has no "
            "elastic policy): leave min_nodes unset or use the PyTorchJob API"
        )
    if options.gang_scheduling:
        errors.append(
            "gang_scheduling: a TrainJob is admitted whole through Kueue: set kueue_queue"
        )
    gpus = options.gpus(launch)
    if options.gpudirect in GPUDIRECT_SETUPS and gpus and gpus != GPUDIRECT_GPUS:
        errors.append(
            f"gpudirect={options.gpudirect!r} with {gpus} GPUs per node: the GPUDirect runtimes "
            f"are built for all {GPUDIRECT_GPUS} GPUs of the machine (set gpus_per_node="
            f"{GPUDIRECT_GPUS}, or gpudirect=false)"
        )
    restarts = options.restarts_per_node
    if restarts not in runtime_restarts():
        errors.append(
            f"restarts_per_node={restarts}: the installed TrainJob runtimes allow "
            f"{', '.join(map(str, runtime_restarts()))} (one ClusterTrainingRuntime each)"
        )
    reserved = sorted(RESERVED_ENV & {*options.env, *options.secrets()})
    if reserved:
        errors.append(f"env {', '.join(reserved)}: reserved by the Trainer's torch plugin")
    return errors


NAME_MAX = 63 - len(f"-{CONTAINER}-0-") - 5
"""A TrainJob's name leaves room for its pods' hostnames, `<name>-node-0-<index>` (a DNS label
of at most 63 characters, for up to 99999 nodes): JobSet refuses names that do not."""


def trainjob_name(run_id: str) -> str:
    """`llmft-train-<run>` (an RFC 1035 label, the CRD's CEL rule), shortened with a hash of the
    run id when too long, so that two long run ids still get two names."""
    import hashlib

    name = job_name(run_id)
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    return f"{name[: NAME_MAX - 9].rstrip('-')}-{digest}"


def build_trainjob(
    *, launch: TrainLaunch, options: PyTorchJobOptions | None = None
) -> dict[str, Any]:
    """The TrainJob for `launch`: `launch.nodes` pods x `launch.nproc_per_node` processes on our
    ClusterTrainingRuntime (`runtime_name(options.restarts_per_node)`).

    Raises:
        ValueError: every problem of the launch and the options, in one message.
    """
    options = options or PyTorchJobOptions()
    launch.validate()
    errors = options.errors(launch) + trainjob_errors(launch, options)
    if errors:
        raise ValueError("invalid TrainJob options:\n  - " + "\n  - ".join(errors))
    name = trainjob_name(launch.run_id)
    run_labels = {**options.labels, **k8s_labels(launch.run_id, "trainer")}
    labels = dict(run_labels)
    if options.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = options.kueue_queue
    metadata: dict[str, Any] = {"name": name, "namespace": options.namespace, "labels": labels}
    if options.owner:
        metadata["ownerReferences"] = [dict(options.owner)]
    assert options.restarts_per_node is not None  # trainjob_errors
    spec: dict[str, Any] = {
        "runtimeRef": {
            "apiGroup": GROUP,
            "kind": RUNTIME_KIND,
            "name": runtime_name(options.restarts_per_node, options.gpudirect),
        },
        "trainer": _trainer(launch, options, rendezvous_endpoint(launch, options.namespace)),
        "runtimePatches": [_runtime_patch(launch, options, run_labels)],
    }
    if options.kueue_queue:
        spec["suspend"] = True
    if options.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = options.active_deadline_seconds
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata, "spec": spec}


def rendezvous_endpoint(launch: TrainLaunch, namespace: str) -> str:
    """The launch's endpoint, else the run's etcd Service, else (c10d) node 0's stable hostname
    (`<job>-node-0-0.<job>`: JobSet's headless Service, jobset.go `IdentifyPodNetwork`)."""
    if launch.rdzv_endpoint:
        return launch.rdzv_endpoint
    if launch.rdzv_backend == "c10d":
        name = trainjob_name(launch.run_id)
        return f"{name}-{CONTAINER}-0-0.{name}:{C10D_PORT}"
    return etcd_endpoint(run_id=launch.run_id, namespace=namespace)


def _trainer(launch: TrainLaunch, options: PyTorchJobOptions, endpoint: str) -> dict[str, Any]:
    """`spec.trainer`: the image, the PyTorchJob's torchrun command, env and Secrets, resources;
    with GPUDirect the setup's NCCL env and its command prefix (the rest is in the runtime)."""
    gpus = options.gpus(launch)
    container = {
        "name": CONTAINER,
        "command": torchrun_command(launch, endpoint, launch.nodes),
        "env": container_env(options, gpus),
    }
    if options.gpudirect:
        patch = gpudirect_patch(options.gpudirect, gpus)
        patch.annotations, patch.volumes, patch.sidecars, patch.mounts = {}, [], [], []
        apply_patch({"spec": {"containers": [container]}}, CONTAINER, patch)
    trainer: dict[str, Any] = {
        "image": options.image,
        "command": container["command"],
        "env": container["env"],
        "numNodes": launch.nodes,
        "numProcPerNode": launch.nproc_per_node,
    }
    resources = container_resources(options, gpus)
    if resources:
        trainer["resourcesPerNode"] = resources
    return trainer


def _runtime_patch(
    launch: TrainLaunch, options: PyTorchJobOptions, run_labels: dict[str, str]
) -> dict[str, Any]:
    """Our runtimePatch: the pods' labels and placement, /dev/shm, the image's user."""
    pod_spec: dict[str, Any] = {
        **pod_placement(launch, options),
        "volumes": [shm_volume(options)],
        "containers": [
            {"name": CONTAINER, "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
        ],
    }
    pod_template = {"metadata": {"labels": dict(run_labels)}, "spec": pod_spec}
    replicated_job = {"name": CONTAINER, "template": {"spec": {"template": pod_template}}}
    return {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated_job]}}},
    }
