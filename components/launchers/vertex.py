"""Vertex AI backend: the run as a CustomJob with two worker pools (primary + N-1 workers).

Every replica runs the project image with torchrun; rendezvous is c10d hosted by the primary
replica (workerpool0), whose address Vertex gives every replica (MASTER_ADDR/MASTER_PORT, else the
first entry of workerpool0 in CLUSTER_SPEC). The primary is told `is_host=1` and the others
`is_host=0` rather than letting torch guess from hostnames, which differ from Vertex's addresses.

Idempotent like GCPC's remote runner (`job_remote_runner.check_if_job_exists`): a retried task
first reads its `gcp_resources` output, then lists the run's jobs by label, and follows a job a
previous attempt started (unless that one failed: then a new one resumes from the checkpoints).
Transient API errors while polling are retried with exponential backoff.

Cleanup in depth: the launcher writes a `gcp_resources` output in Google Cloud Pipeline
Components' format right after creating the job, so cancelling the pipeline run cancels the job
(Vertex Pipelines reads it); SIGTERM or any failure of the launcher cancels it too; cleanup
cancels every job with the run label.

The Hugging Face token is never in the job spec: replicas get the Secret Manager secret's name
(`HF_TOKEN_SECRET`) and read the value at start (components/secrets.py).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Mapping
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
from components.secrets import HF_TOKEN_SECRET_ENV, secret_version_name

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


_READ_HF_TOKEN = (
    f'if [ -n "${{{HF_TOKEN_SECRET_ENV}:-}}" ]; then '
    f'HF_TOKEN="$(python -m components.secrets "${HF_TOKEN_SECRET_ENV}")"; '
    'if [ -n "$HF_TOKEN" ]; then export HF_TOKEN; else unset HF_TOKEN; fi; fi; '
)


def _torchrun_command(launch: TrainLaunch, *, primary: bool) -> list[str]:
    """`bash -c` script: read the HF token from Secret Manager when a secret is named, resolve
    the primary's address at run time, then exec torchrun."""
    placeholder = "@RDZV@"
    torchrun = [
        '--rdzv-endpoint="$RDZV"' if arg == f"--rdzv-endpoint={placeholder}" else shlex.quote(arg)
        for arg in launch.torchrun_args(placeholder, rdzv_conf=f"is_host={int(primary)}")
    ]
    program = shlex.join([*launch.entrypoint, *launch.trainer_args()])
    script = _READ_HF_TOKEN + (
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
    hf_token_secret: str | None = None,
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
        service_account: service account the replicas run as (reads data, writes outputs);
            None: the Vertex AI Custom Code Service Agent.
        hf_token_secret: Secret Manager secret version holding a Hugging Face token
            (`projects/P/secrets/NAME/versions/V`); replicas read it at start. Optional.
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
    if hf_token_secret and not hf_token_secret.startswith("projects/"):
        errors.append(
            f"hf_token_secret={hf_token_secret!r}: give the secret's resource name "
            "(projects/P/secrets/NAME/versions/V)"
        )
    if env and (HF_TOKEN_SECRET_ENV in env or "HF_TOKEN" in env):
        errors.append("env must not carry the HF token: pass hf_token_secret (read at run time)")
    if errors:
        raise ValueError("invalid Vertex CustomJob options:\n  - " + "\n  - ".join(errors))

    machine = aiplatform_v1.MachineSpec(machine_type=machine_type)
    if accelerator_type and count:
        machine.accelerator_type = getattr(aiplatform_v1.AcceleratorType, accelerator_type)
        machine.accelerator_count = count
    disk = aiplatform_v1.DiskSpec(
        boot_disk_type=boot_disk_type, boot_disk_size_gb=boot_disk_size_gb
    )
    plain_env = {**TORCHRUN_ENV, **(env or {})}
    if hf_token_secret:
        plain_env[HF_TOKEN_SECRET_ENV] = hf_token_secret  # a name; the value is read at run time
    env_vars = [aiplatform_v1.EnvVar(name=k, value=v) for k, v in plain_env.items()]

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


def read_gcp_resources(path: str | None, location: str) -> str:
    """The CustomJob named in a previous attempt's `gcp_resources` output, or "" (GCPC's
    `check_if_job_exists`: an absent or empty file means no job was started)."""
    if not path or not Path(path).is_file() or not Path(path).stat().st_size:
        return ""
    resources = json.loads(Path(path).read_text()).get("resources") or []
    prefix = job_uri(location, "")
    uris = [r.get("resourceUri", "") for r in resources if r.get("resourceType") == "CustomJob"]
    if len(uris) != 1 or not uris[0].startswith(prefix):
        raise ValueError(f"gcp_resources at {path} does not name one CustomJob: {resources}")
    return str(uris[0][len(prefix) :])


def transient_errors() -> tuple[type[BaseException], ...]:
    """API errors worth retrying: the service or the network hiccuped, the request was fine."""
    import requests
    from google.api_core import exceptions
    from google.auth.exceptions import TransportError

    return (
        exceptions.ServiceUnavailable,
        exceptions.InternalServerError,
        exceptions.TooManyRequests,
        exceptions.DeadlineExceeded,
        exceptions.GatewayTimeout,
        exceptions.BadGateway,
        requests.ConnectionError,
        ConnectionError,
        TransportError,
    )


class VertexLauncher(Launcher):
    """Runs the training as a Vertex AI CustomJob and follows it.

    Args:
        project, location: where the job runs.
        job_options: keyword arguments of `build_custom_job` (machine_type, ...); a short
            `hf_token_secret` name is completed to `projects/<project>/secrets/NAME/versions/latest`.
        gcp_resources_path: where to write GCPC's gcp_resources JSON (the KFP output), if any;
            also read first, so a retried task follows the job it already started.
        client: an `aiplatform_v1.JobServiceClient` (default: one for `location`'s endpoint with
            Application Default Credentials); tests pass one with anonymous credentials.
        poll_s: seconds between state polls.
        retries: attempts per API call on transient errors, waiting `backoff_s` x 2^attempt
            (at most 5 minutes) in between.
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
        retries: int = 8,
        backoff_s: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
        log: LogSink | None = None,
    ) -> None:
        super().__init__(log=log)
        if not project:
            raise ValueError("project is empty: pass the Google Cloud project for the Vertex job")
        self.project, self.location = project, location
        self.job_options = dict(job_options or {})
        if self.job_options.get("hf_token_secret"):
            self.job_options["hf_token_secret"] = secret_version_name(
                self.job_options["hf_token_secret"], project
            )
        self.gcp_resources_path = gcp_resources_path
        self.client = client or self._default_client(location)
        self.poll_s = poll_s
        self.retries, self.backoff_s, self._sleep = retries, backoff_s, sleep
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

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        """`call()`, retried with exponential backoff on transient API errors."""
        transient = transient_errors()
        for attempt in range(self.retries):
            try:
                return call()
            except transient as exc:
                if attempt == self.retries - 1:
                    raise
                wait = min(self.backoff_s * 2**attempt, 300.0)
                self.log(f"[vertex] {what}: {type(exc).__name__}: {exc}; retrying in {wait:.0f}s")
                self._sleep(wait)
        raise AssertionError("unreachable")

    def _get(self, name: str) -> Any:
        from google.cloud import aiplatform_v1

        return self._call(
            f"get {name}",
            lambda: self.client.get_custom_job(
                request=aiplatform_v1.GetCustomJobRequest(name=name)
            ),
        )

    def find_started(self, launch: TrainLaunch) -> str:
        """A job of this run that a previous attempt started and that is running or succeeded:
        from `gcp_resources` first, else the newest job carrying the run label; "" if none."""
        from google.cloud import aiplatform_v1

        usable = (*ACTIVE, "JOB_STATE_SUCCEEDED")
        recorded = read_gcp_resources(self.gcp_resources_path, self.location)
        if recorded:
            state = self._get(recorded).state.name
            if state in usable:
                return recorded
            self.log(f"[vertex] {recorded} from a previous attempt is {state}: starting anew")
            return ""
        request = aiplatform_v1.ListCustomJobsRequest(
            parent=self.parent, filter=f'labels.{VERTEX_RUN_LABEL}="{launch.rdzv_id}"'
        )
        jobs = self._call("list jobs", lambda: list(self.client.list_custom_jobs(request=request)))
        jobs = [
            j for j in jobs if j.state.name in usable and j.state.name != "JOB_STATE_CANCELLING"
        ]
        jobs.sort(key=lambda j: j.create_time.timestamp() if j.create_time else 0.0)
        return str(jobs[-1].name) if jobs else ""

    def start(self, launch: TrainLaunch) -> None:
        from google.cloud import aiplatform_v1

        self.launch = launch
        job = build_custom_job(launch=launch, **self.job_options)
        existing = self.find_started(launch)
        if existing:
            self.job_name = existing
            self.log(f"[vertex] following CustomJob {existing} started by a previous attempt")
        else:
            # Not retried: a create that timed out may have succeeded; the next attempt of the
            # task finds that job by its label instead of starting a second one.
            created = self.client.create_custom_job(
                request=aiplatform_v1.CreateCustomJobRequest(parent=self.parent, custom_job=job)
            )
            self.job_name = created.name
        if self.gcp_resources_path:
            write_gcp_resources(self.gcp_resources_path, self.location, self.job_name)
        self.log(
            f"[vertex] CustomJob {self.job_name}: https://console.cloud.google.com/"
            f"vertex-ai/locations/{self.location}/training/{self.job_name.rsplit('/', 1)[-1]}"
            f"/cpu?project={self.project}"
        )

    def wait(self, *, timeout: float | None = None) -> LaunchResult:
        if self.launch is None or not self.job_name:
            raise RuntimeError("start() a run before wait()")
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        last = ""
        while True:
            job = self._get(self.job_name)
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
            self._call(
                f"cancel {name}",
                lambda: self.client.cancel_custom_job(
                    request=aiplatform_v1.CancelCustomJobRequest(name=name)
                ),
            )
        except (exceptions.NotFound, exceptions.BadRequest, exceptions.FailedPrecondition):
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
