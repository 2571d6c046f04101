"""Vertex AI backend: the run as a CustomJob with two worker pools (primary + N-1 workers).

Every replica runs the project image with torchrun; rendezvous is c10d hosted by the primary
replica (workerpool0), whose address Vertex gives every replica (MASTER_ADDR/MASTER_PORT, else the
first entry of workerpool0 in CLUSTER_SPEC). The primary is told `is_host=1` and the others
`is_host=0` rather than letting torch guess from hostnames, which differ from Vertex's addresses.

Cleanup in depth: the launcher writes a `gcp_resources` output in Google Cloud Pipeline
Components' format right after creating the job, so cancelling the pipeline run cancels the job
(Vertex Pipelines reads it); SIGTERM cancels it too; cleanup cancels every job with the run label.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
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
from components.run_identity import VERTEX_RUN_LABEL, resource_name, safe_run_id, vertex_labels
from components.run_params import RunParams

DEFAULT_MACHINE = RunParams.machine_type
DEFAULT_ACCELERATOR = RunParams.accelerator_type
_PRIMARY_ADDRESS = (
    'python -c "import json,os; '
    "print(json.loads(os.environ['CLUSTER_SPEC'])['cluster']['workerpool0'][0])\""
)


def api_endpoint(location: str) -> str:
    return f"{location}-aiplatform.googleapis.com"


def job_uri(location: str, job_name: str) -> str:
    """The resource URI GCPC writes in gcp_resources (what Vertex Pipelines cancels)."""
    return f"https://{api_endpoint(location)}/v1/{job_name}"


def _torchrun_command(launch: TrainLaunch, *, primary: bool) -> list[str]:
    """`bash -c` script: resolve the primary's address at run time, then exec torchrun."""
    placeholder = "@RDZV@"
    torchrun = [
        '--rdzv-endpoint="$RDZV"' if arg == f"--rdzv-endpoint={placeholder}" else shlex.quote(arg)
        for arg in launch.torchrun_args(placeholder, rdzv_conf=f"is_host={int(primary)}")
    ]
    program = shlex.join([*launch.entrypoint, *launch.trainer_args()])
    script = (
        'if [ -n "${MASTER_ADDR:-}" ]; then RDZV="$MASTER_ADDR:${MASTER_PORT:-29400}"; '
        f"else RDZV=$({_PRIMARY_ADDRESS}); fi; "
        f"exec python -m torch.distributed.run {' '.join(torchrun)} {program}"
    )
    return ["bash", "-c", script]


def build_custom_job(
    *,
    launch: TrainLaunch,
    image: str = DEFAULT_IMAGE,
    machine_type: str = DEFAULT_MACHINE,
    accelerator_type: str | None = DEFAULT_ACCELERATOR,
    accelerator_count: int | None = None,
    boot_disk_type: str = "pd-ssd",
    boot_disk_size_gb: int = 500,
    network: str | None = None,
    reserved_ip_ranges: list[str] | None = None,
    service_account: str | None = None,
    env: Mapping[str, str] | None = None,
    base_output_directory: str | None = None,
    timeout_s: int | None = None,
    restart_job_on_worker_restart: bool = False,
    enable_web_access: bool = False,
    labels: Mapping[str, str] | None = None,
) -> Any:
    """The `aiplatform_v1.CustomJob` for `launch` (primary pool of 1 + worker pool of nodes-1).

    Args:
        launch: what to run; rdzv_backend must be c10d (rendezvous at the primary replica;
            Vertex has no per-run etcd).
        image: the project image (pinned tag).
        machine_type: Compute Engine machine type of every replica.
        accelerator_type: Vertex accelerator name (e.g. NVIDIA_H100_80GB); None for CPU.
        accelerator_count: accelerators per replica (default: nproc_per_node).
        boot_disk_type, boot_disk_size_gb: each replica's boot disk.
        network: VPC network (`projects/NUMBER/global/networks/NAME`) to peer with, if any.
        reserved_ip_ranges: reserved IP ranges in that network to use.
        service_account: service account the replicas run as (reads data, writes outputs).
        env: plain environment variables (secrets: read them from Secret Manager by name).
        base_output_directory: gs:// dir Vertex exposes as AIP_MODEL_DIR etc. (optional).
        timeout_s: maximum run time.
        restart_job_on_worker_restart: restart all replicas when one restarts.
        enable_web_access: interactive shell into the replicas (debugging).
        labels: extra labels (the run's labels are always set).
    """
    from google.cloud import aiplatform_v1
    from google.protobuf import duration_pb2

    launch.validate()
    errors = []
    if launch.rdzv_backend != "c10d":
        errors.append(
            f"rdzv_backend={launch.rdzv_backend!r}: Vertex rendezvouses at the primary replica, "
            "use c10d"
        )
    if launch.rdzv_endpoint:
        errors.append("rdzv_endpoint must be empty on Vertex (the primary replica hosts it)")
    count = (
        accelerator_count
        if accelerator_count is not None
        else (launch.nproc_per_node if accelerator_type else 0)
    )
    if count and not accelerator_type:
        errors.append("accelerator_count is set but accelerator_type is not")
    if accelerator_type and accelerator_type not in aiplatform_v1.AcceleratorType.__members__:
        errors.append(
            f"accelerator_type={accelerator_type!r} is not a Vertex accelerator name "
            "(e.g. NVIDIA_H100_80GB, NVIDIA_L4)"
        )
    if errors:
        raise ValueError("invalid Vertex CustomJob options:\n  - " + "\n  - ".join(errors))

    machine = aiplatform_v1.MachineSpec(machine_type=machine_type)
    if accelerator_type and count:
        machine.accelerator_type = getattr(aiplatform_v1.AcceleratorType, accelerator_type)
        machine.accelerator_count = count
    disk = aiplatform_v1.DiskSpec(
        boot_disk_type=boot_disk_type, boot_disk_size_gb=boot_disk_size_gb
    )
    env_vars = [
        aiplatform_v1.EnvVar(name=k, value=v) for k, v in {**TORCHRUN_ENV, **(env or {})}.items()
    ]

    def pool(primary: bool, replicas: int) -> Any:
        return aiplatform_v1.WorkerPoolSpec(
            machine_spec=machine,
            replica_count=replicas,
            disk_spec=disk,
            container_spec=aiplatform_v1.ContainerSpec(
                image_uri=image, command=_torchrun_command(launch, primary=primary), env=env_vars
            ),
        )

    pools = [pool(True, 1)]
    if launch.nodes > 1:
        pools.append(pool(False, launch.nodes - 1))
    spec = aiplatform_v1.CustomJobSpec(worker_pool_specs=pools, enable_web_access=enable_web_access)
    if service_account:
        spec.service_account = service_account
    if network:
        spec.network = network
    if reserved_ip_ranges:
        spec.reserved_ip_ranges = list(reserved_ip_ranges)
    if base_output_directory:
        spec.base_output_directory = aiplatform_v1.GcsDestination(
            output_uri_prefix=base_output_directory
        )
    if timeout_s or restart_job_on_worker_restart:
        spec.scheduling = aiplatform_v1.Scheduling(
            restart_job_on_worker_restart=restart_job_on_worker_restart
        )
        if timeout_s:
            spec.scheduling.timeout = duration_pb2.Duration(seconds=timeout_s)
    return aiplatform_v1.CustomJob(
        display_name=resource_name("train", launch.run_id),
        job_spec=spec,
        labels={**(labels or {}), **vertex_labels(launch.run_id)},
    )


def write_gcp_resources(path: str, location: str, job_name: str) -> None:
    """GCPC's `gcp_resources` JSON for one CustomJob (Vertex Pipelines cancels it with the run)."""
    payload = {
        "resources": [{"resourceType": "CustomJob", "resourceUri": job_uri(location, job_name)}]
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload))


TERMINAL = {
    "JOB_STATE_SUCCEEDED": SUCCEEDED,
    "JOB_STATE_FAILED": FAILED,
    "JOB_STATE_CANCELLED": CANCELLED,
    "JOB_STATE_EXPIRED": FAILED,
    "JOB_STATE_PARTIALLY_SUCCEEDED": FAILED,
}
ACTIVE = (
    "JOB_STATE_QUEUED",
    "JOB_STATE_PENDING",
    "JOB_STATE_RUNNING",
    "JOB_STATE_UPDATING",
    "JOB_STATE_PAUSED",
    "JOB_STATE_CANCELLING",
)


class VertexLauncher(Launcher):
    """Runs the training as a Vertex AI CustomJob and follows it.

    Args:
        project, location: where the job runs.
        job_options: keyword arguments of `build_custom_job` (machine_type, ...).
        gcp_resources_path: where to write GCPC's gcp_resources JSON (the KFP output), if any.
        client: an `aiplatform_v1.JobServiceClient` (default: one for `location`'s endpoint with
            Application Default Credentials); tests pass one with anonymous credentials.
        poll_s: seconds between state polls.
    """

    backend = "vertex"

    def __init__(
        self,
        *,
        project: str,
        location: str = RunParams.region,
        job_options: Mapping[str, Any] | None = None,
        gcp_resources_path: str | None = None,
        client: Any = None,
        poll_s: float = 30.0,
        log: LogSink | None = None,
    ) -> None:
        super().__init__(log=log)
        if not project:
            raise ValueError("project is empty: pass the Google Cloud project for the Vertex job")
        self.project, self.location = project, location
        self.job_options = dict(job_options or {})
        self.gcp_resources_path = gcp_resources_path
        self.client = client or self._default_client(location)
        self.poll_s = poll_s
        self.job_name = ""
        self._cancelled = False

    @staticmethod
    def _default_client(location: str) -> Any:
        from google.cloud import aiplatform_v1

        return aiplatform_v1.JobServiceClient(
            client_options={"api_endpoint": api_endpoint(location)}
        )

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"

    def start(self, launch: TrainLaunch) -> None:
        from google.cloud import aiplatform_v1

        self.launch = launch
        job = build_custom_job(launch=launch, **self.job_options)
        created = self.client.create_custom_job(
            request=aiplatform_v1.CreateCustomJobRequest(parent=self.parent, custom_job=job)
        )
        self.job_name = created.name
        if self.gcp_resources_path:
            write_gcp_resources(self.gcp_resources_path, self.location, self.job_name)
        self.log(
            f"[vertex] created CustomJob {self.job_name}: https://console.cloud.google.com/"
            f"vertex-ai/locations/{self.location}/training/{self.job_name.rsplit('/', 1)[-1]}"
            f"/cpu?project={self.project}"
        )

    def wait(self, *, timeout: float | None = None) -> LaunchResult:
        from google.cloud import aiplatform_v1

        if self.launch is None or not self.job_name:
            raise RuntimeError("start() a run before wait()")
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        last = ""
        while True:
            job = self.client.get_custom_job(
                request=aiplatform_v1.GetCustomJobRequest(name=self.job_name)
            )
            state = job.state.name
            if state != last:
                self.log(f"[vertex] {self.job_name}: {state}")
                last = state
            if state in TERMINAL:
                status = TERMINAL[state]
                message = state if not job.error.message else f"{state}: {job.error.message}"
                break
            if deadline is not None and time.monotonic() > deadline:
                self.cancel()
                status, message = (
                    FAILED,
                    f"timed out after {timeout:.0f}s; cancelled {self.job_name}",
                )
                break
            time.sleep(self.poll_s)
        return LaunchResult(
            run_id=self.launch.run_id, backend=self.backend, status=status,
            output=self.launch.output, message=message, duration_s=time.monotonic() - started,
            details={"job": self.job_name, "state": state},
        )  # fmt: skip

    def cancel(self) -> None:
        self._cancelled = True
        if self.job_name:
            self._cancel(self.job_name)

    def _cancel(self, name: str) -> bool:
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        try:
            self.client.cancel_custom_job(request=aiplatform_v1.CancelCustomJobRequest(name=name))
        except (exceptions.NotFound, exceptions.BadRequest):
            # Gone, or already finished: FAILED_PRECONDITION, which REST reports as a plain 400.
            return False
        self.log(f"[vertex] cancelled {name}")
        return True

    def cleanup(self, run_id: str) -> list[str]:
        """Cancel every still-active CustomJob carrying the run's label."""
        from google.cloud import aiplatform_v1

        request = aiplatform_v1.ListCustomJobsRequest(
            parent=self.parent, filter=f'labels.{VERTEX_RUN_LABEL}="{safe_run_id(run_id)}"'
        )
        cancelled = []
        for job in self.client.list_custom_jobs(request=request):
            cancellable = job.state.name in ACTIVE and job.state.name != "JOB_STATE_CANCELLING"
            if cancellable and self._cancel(job.name):
                cancelled.append(f"CustomJob {job.name}")
        return cancelled
