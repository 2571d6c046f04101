"""The Vertex AI CustomJob of a launch: a pure builder, no API call.

`build_custom_job(launch=..., options=CustomJobOptions(...))` returns an `aiplatform_v1.CustomJob`
with two worker pools (primary + N-1 workers); `components/launchers/vertex.py` submits and
follows it. Every replica runs the project image with torchrun; rendezvous is c10d hosted by the
primary replica (workerpool0), whose address Vertex gives every replica (MASTER_ADDR/MASTER_PORT,
else the first entry of workerpool0 in CLUSTER_SPEC). The primary is told `is_host=1` and the
others `is_host=0` rather than letting torch guess from hostnames, which differ from Vertex's
addresses.

The Hugging Face token is never in the job spec: replicas get the Secret Manager secret's name
(`HF_TOKEN_SECRET`) and read the value at start (components/runtime/secrets.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.launchers.base import TORCHRUN_ENV, TrainLaunch
from components.launchers.vocab import DEFAULT_ACCELERATOR_TYPE, DEFAULT_MACHINE_TYPE
from components.platform.capacity import CAPACITIES
from components.platform.platform_facts import machine_accelerator_errors
from components.runtime.image import DEFAULT_IMAGE
from components.runtime.run_identity import resource_name, vertex_labels
from components.runtime.secrets import HF_TOKEN_SECRET_ENV

_PRIMARY_ADDRESS = (
    'python -c "import json,os; '
    "print(json.loads(os.environ['CLUSTER_SPEC'])['cluster']['workerpool0'][0])\""
)


def read_secret_script(env: str, name_env: str) -> str:
    """Shell that sets `env` from the Secret Manager version named in `name_env` (if any)."""
    return (
        f'if [ -n "${{{name_env}:-}}" ]; then '
        f'{env}="$(python -m components.runtime.secrets "${name_env}")"; '
        f'if [ -n "${env}" ]; then export {env}; else unset {env}; fi; fi; '
    )


_READ_HF_TOKEN = read_secret_script("HF_TOKEN", HF_TOKEN_SECRET_ENV)


@dataclass(frozen=True)
class CustomJobOptions:
    """How the CustomJob of a launch runs on Vertex AI (everything but what to run)."""

    image: str = DEFAULT_IMAGE
    """The project image (pinned tag)."""
    machine_type: str = DEFAULT_MACHINE_TYPE
    """Compute Engine machine type of every replica."""
    accelerator_type: str | None = DEFAULT_ACCELERATOR_TYPE
    """Vertex accelerator name (e.g. NVIDIA_H100_80GB); None for CPU."""
    accelerator_count: int | None = None
    """Accelerators per replica (default: nproc_per_node)."""
    boot_disk_type: str = "pd-ssd"
    """Each replica's boot disk type."""
    boot_disk_size_gb: int = 500
    """Each replica's boot disk size."""
    network: str | None = None
    """VPC network (`projects/NUMBER/global/networks/NAME`) to peer with, if any."""
    reserved_ip_ranges: tuple[str, ...] = ()
    """Reserved IP ranges in that network to use."""
    service_account: str | None = None
    """Service account the replicas run as (reads data, writes outputs); None: the Vertex AI
    Custom Code Service Agent."""
    hf_token_secret: str | None = None
    """Secret Manager secret version holding a Hugging Face token
    (`projects/P/secrets/NAME/versions/V`); replicas read it at start. Optional."""
    secret_env: Mapping[str, str] = field(default_factory=dict)
    """Env vars each replica reads from Secret Manager at start: `{"MLFLOW_TRACKING_TOKEN":
    "projects/P/secrets/NAME/versions/V"}`; only the version's name is in the job spec (as
    `<ENV>_SECRET`)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Plain environment variables (secrets: read them from Secret Manager by name)."""
    base_output_directory: str | None = None
    """gs:// dir Vertex exposes as AIP_MODEL_DIR etc. (optional)."""
    timeout_s: int | None = None
    """Maximum run time."""
    restart_job_on_worker_restart: bool = False
    """Restart all replicas when one restarts."""
    enable_web_access: bool = False
    """Interactive shell into the replicas (debugging)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra labels (the run's labels are always set)."""
    # --- TensorBoard and CMEK (issue 30) ---
    tensorboard: str | None = None
    """Vertex AI TensorBoard instance (projects/P/locations/L/tensorboards/ID) the job uploads
    its events to; Vertex then sets AIP_TENSORBOARD_LOG_DIR (needs service_account and
    base_output_directory)."""
    encryption_key: str | None = None
    """Cloud KMS key the job and its outputs are encrypted with (the pipeline's CMEK key)."""

    # --- capacity (components/platform/capacity.py) -----------------------------------------------------
    capacity: str = "on-demand"
    """on-demand, spot (`scheduling.strategy` SPOT) or flex-start (FLEX_START: Dynamic Workload
    Scheduler queues the job until its machines are free)."""
    max_wait_s: int | None = None
    """flex-start: how long the job may wait for its machines (`scheduling.max_wait_duration`;
    None: Vertex's default)."""
    reservation: str | None = None
    """A Compute Engine reservation (`projects/P/zones/Z/reservations/NAME`) every replica
    consumes (`machine_spec.reservation_affinity`, SPECIFIC_RESERVATION)."""

    def capacity_errors(self) -> list[str]:
        """Problems of the capacity settings, each with what to change."""
        errors = []
        if self.capacity not in CAPACITIES:
            errors.append(f"capacity={self.capacity!r}: choose one of {', '.join(CAPACITIES)}")
        if self.max_wait_s is not None and self.capacity != "flex-start":
            errors.append("max_wait_s applies to capacity=flex-start only")
        if self.reservation and self.capacity != "on-demand":
            errors.append(
                f"reservation with capacity={self.capacity!r}: reservations are on-demand"
            )
        return errors

    def accelerators(self, launch: TrainLaunch) -> int:
        """Accelerators per replica: `accelerator_count`, else one per process when typed."""
        return launch.accelerators_per_node(self.accelerator_count, self.accelerator_type)

    def errors(self, launch: TrainLaunch) -> list[str]:
        """Every problem with these options for `launch`, so the user fixes them in one go."""
        from google.cloud import aiplatform_v1

        errors = []
        if launch.rdzv_backend != "c10d":
            errors.append(
                f"rdzv_backend={launch.rdzv_backend!r}: Vertex rendezvouses at the primary "
                "replica, use c10d"
            )
        if launch.rdzv_endpoint:
            errors.append("rdzv_endpoint must be empty on Vertex (the primary replica hosts it)")
        accelerator = self.accelerator_type
        if self.accelerators(launch) and not accelerator:
            errors.append("accelerator_count is set but accelerator_type is not")
        if accelerator and accelerator not in aiplatform_v1.AcceleratorType.__members__:
            errors.append(
                f"accelerator_type={accelerator!r} is not a Vertex accelerator name "
                "(e.g. NVIDIA_H100_80GB, NVIDIA_L4)"
            )
        else:  # the machine type fixes the GPUs: refused here, not by create_custom_job later
            count = self.accelerators(launch) if accelerator else 0
            errors += machine_accelerator_errors(self.machine_type, accelerator or "", count)
        secret = self.hf_token_secret
        if secret and not secret.startswith("projects/"):
            errors.append(
                f"hf_token_secret={secret!r}: give the secret's resource name "
                "(projects/P/secrets/NAME/versions/V)"
            )
        if HF_TOKEN_SECRET_ENV in self.env or "HF_TOKEN" in self.env:
            errors.append(
                "env must not carry the HF token: pass hf_token_secret (read at run time)"
            )
        for env, version in self.secret_env.items():
            if not version.startswith("projects/") or "/versions/" not in version:
                errors.append(
                    f"secret_env[{env!r}]={version!r}: give the secret version's resource name "
                    "(projects/P/secrets/NAME/versions/V)"
                )
            if env in self.env:
                errors.append(f"{env} is in both env and secret_env: keep it in secret_env only")
        errors += tracking_errors(self)
        return errors + self.capacity_errors()


def torchrun_command(
    launch: TrainLaunch, *, primary: bool, secret_env: tuple[str, ...] = ()
) -> list[str]:
    """`bash -c` script: read the HF token (and each of `secret_env`) from Secret Manager when a
    secret is named, resolve the primary's address at run time, then exec torchrun."""
    placeholder = "@RDZV@"
    torchrun = [
        '--rdzv-endpoint="$RDZV"' if arg == f"--rdzv-endpoint={placeholder}" else shlex.quote(arg)
        for arg in launch.torchrun_args(placeholder, rdzv_conf=f"is_host={int(primary)}")
    ]
    program = shlex.join([*launch.entrypoint, *launch.trainer_args()])
    reads = "".join(read_secret_script(env, f"{env}_SECRET") for env in secret_env)
    script = (
        _READ_HF_TOKEN
        + reads
        + (
            'if [ -n "${MASTER_ADDR:-}" ]; then RDZV="$MASTER_ADDR:${MASTER_PORT:-29400}"; '
            f"else RDZV=$({_PRIMARY_ADDRESS}); fi; "
            f"exec python -m torch.distributed.run {' '.join(torchrun)} {program}"
        )
    )
    return ["bash", "-c", script]


def build_custom_job(*, launch: TrainLaunch, options: CustomJobOptions | None = None) -> Any:
    """The `aiplatform_v1.CustomJob` for `launch` (primary pool of 1 + worker pool of nodes-1).

    Args:
        launch: what to run; rdzv_backend must be c10d (rendezvous at the primary replica;
            Vertex has no per-run etcd).
        options: how it runs (default `CustomJobOptions()`).

    Raises:
        ValueError: every problem of the launch and the options, in one message.
    """
    from google.cloud import aiplatform_v1

    options = options or CustomJobOptions()
    launch.validate()
    errors = options.errors(launch)
    if errors:
        raise ValueError("invalid Vertex CustomJob options:\n  - " + "\n  - ".join(errors))
    pools = [_pool(launch, options, primary=True, replicas=1)]
    if launch.nodes > 1:
        pools.append(_pool(launch, options, primary=False, replicas=launch.nodes - 1))
    job = aiplatform_v1.CustomJob(
        display_name=resource_name("train", launch.run_id),
        job_spec=_job_spec(pools, options),
        labels={**options.labels, **vertex_labels(launch.run_id)},
    )
    apply_tracking(job, options)
    return job


def _pool(launch: TrainLaunch, options: CustomJobOptions, *, primary: bool, replicas: int) -> Any:
    """One worker pool: machine, disk, the image running torchrun, plain environment."""
    from google.cloud import aiplatform_v1

    machine = aiplatform_v1.MachineSpec(machine_type=options.machine_type)
    count = options.accelerators(launch)
    if options.accelerator_type and count:
        machine.accelerator_type = getattr(aiplatform_v1.AcceleratorType, options.accelerator_type)
        machine.accelerator_count = count
    if options.reservation:
        machine.reservation_affinity = _reservation_affinity(options.reservation)
    disk = aiplatform_v1.DiskSpec(
        boot_disk_type=options.boot_disk_type, boot_disk_size_gb=options.boot_disk_size_gb
    )
    plain_env = {**TORCHRUN_ENV, **options.env}
    if options.hf_token_secret:
        # A name; the value is read at run time.
        plain_env[HF_TOKEN_SECRET_ENV] = options.hf_token_secret
    for env, version in options.secret_env.items():
        plain_env[f"{env}_SECRET"] = version  # the name only, read at run time
    return aiplatform_v1.WorkerPoolSpec(
        machine_spec=machine,
        replica_count=replicas,
        disk_spec=disk,
        container_spec=aiplatform_v1.ContainerSpec(
            image_uri=options.image,
            command=torchrun_command(launch, primary=primary, secret_env=tuple(options.secret_env)),
            env=[aiplatform_v1.EnvVar(name=k, value=v) for k, v in plain_env.items()],
        ),
    )


def _job_spec(pools: list[Any], options: CustomJobOptions) -> Any:
    """The CustomJobSpec: the pools plus identity, network, outputs and scheduling."""
    from google.cloud import aiplatform_v1
    from google.protobuf import duration_pb2

    spec = aiplatform_v1.CustomJobSpec(
        worker_pool_specs=pools, enable_web_access=options.enable_web_access
    )
    if options.service_account:
        spec.service_account = options.service_account
    if options.network:
        spec.network = options.network
    if options.reserved_ip_ranges:
        spec.reserved_ip_ranges = list(options.reserved_ip_ranges)
    if options.base_output_directory:
        spec.base_output_directory = aiplatform_v1.GcsDestination(
            output_uri_prefix=options.base_output_directory
        )
    if options.timeout_s or options.restart_job_on_worker_restart or _strategy(options):
        spec.scheduling = aiplatform_v1.Scheduling(
            restart_job_on_worker_restart=options.restart_job_on_worker_restart
        )
        if options.timeout_s:
            spec.scheduling.timeout = duration_pb2.Duration(seconds=options.timeout_s)
        _schedule_capacity(spec.scheduling, options)
    return spec


# --- capacity: scheduling strategy, the wait for flex-start, reservations -----------------------

RESERVATION_KEY = "compute.googleapis.com/reservation-name"
"""The key of a specific reservation's affinity (cloud.google.com/vertex-ai/docs/training/
use-reservations)."""
_STRATEGIES = {"spot": "SPOT", "flex-start": "FLEX_START"}
"""capacity -> `Scheduling.Strategy` (on-demand leaves it unset: Vertex's default)."""


def _strategy(options: CustomJobOptions) -> str | None:
    return _STRATEGIES.get(options.capacity)


def _schedule_capacity(scheduling: Any, options: CustomJobOptions) -> None:
    """`scheduling.strategy` and, for flex-start, `max_wait_duration`."""
    from google.cloud import aiplatform_v1
    from google.protobuf import duration_pb2

    strategy = _strategy(options)
    if strategy:
        scheduling.strategy = getattr(aiplatform_v1.Scheduling.Strategy, strategy)
    if options.max_wait_s:
        scheduling.max_wait_duration = duration_pb2.Duration(seconds=options.max_wait_s)


def _reservation_affinity(reservation: str) -> Any:
    from google.cloud import aiplatform_v1

    return aiplatform_v1.ReservationAffinity(
        reservation_affinity_type=aiplatform_v1.ReservationAffinity.Type.SPECIFIC_RESERVATION,
        key=RESERVATION_KEY,
        values=[reservation],
    )


# --- TensorBoard and CMEK (issue 30) --------------------------------------------------------------


def tracking_errors(options: CustomJobOptions) -> list[str]:
    """Vertex uploads TensorBoard events only for a job with its own service account and a
    base output directory (CustomJobSpec.tensorboard reference)."""
    errors = []
    if options.tensorboard:
        if not options.service_account:
            errors.append(
                "tensorboard needs service_account: Vertex uploads TensorBoard events only for "
                "jobs that run as a service account you name"
            )
        if not options.base_output_directory:
            errors.append("tensorboard needs base_output_directory (a gs:// dir for the events)")
    return errors


def apply_tracking(job: Any, options: CustomJobOptions) -> None:
    """Attach the TensorBoard instance and the CMEK key to `job` (an aiplatform_v1.CustomJob)."""
    from google.cloud import aiplatform_v1

    if options.tensorboard:
        job.job_spec.tensorboard = options.tensorboard
    if options.encryption_key:
        job.encryption_spec = aiplatform_v1.EncryptionSpec(kms_key_name=options.encryption_key)
