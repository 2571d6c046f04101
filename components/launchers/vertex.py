"""Vertex AI backend: the run as a CustomJob (components/launchers/customjob.py), submitted
and followed.

Idempotent like GCPC's remote runner (`job_remote_runner.check_if_job_exists`): a retried task
first reads its `gcp_resources` output, then lists the run's jobs by label, and follows a job a
previous attempt started (unless that one failed: then a new one resumes from the checkpoints).
Transient API errors while polling are retried with exponential backoff.

Cleanup in depth: cancelling the pipeline run sends the task SIGTERM, and `Launcher.run` cancels
the job then (as GCPC's own SIGTERM handler does); any failure of the launcher cancels it too;
cleanup cancels every job with the run label. The `gcp_resources` output, written in Google
Cloud Pipeline Components' format right after the job is created, is the console's link to the
job and what a retried task reads first; it cancels nothing by itself.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from components.launchers.base import (
    CANCELLED,
    FAILED,
    SUCCEEDED,
    Launcher,
    LaunchResult,
    LogSink,
    TrainLaunch,
)
from components.launchers.customjob import CustomJobOptions, build_custom_job
from components.launchers.vocab import DEFAULT_REGION
from components.runtime.run_identity import VERTEX_RUN_LABEL, safe_run_id
from components.runtime.secrets import secret_version_name
from trainer.cuda_guard import expect_cuda_env


def api_endpoint(location: str) -> str:
    return f"{location}-aiplatform.googleapis.com"


def job_uri(location: str, job_name: str) -> str:
    """The resource URI GCPC writes in gcp_resources (the console's link to the job)."""
    return f"https://{api_endpoint(location)}/v1/{job_name}"


def write_gcp_resources(path: str, location: str, job_name: str) -> None:
    """GCPC's `gcp_resources` JSON for one CustomJob (the console links it; a retry reads it)."""
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


def job_times(job: Any) -> dict[str, str]:
    """The CustomJob's own start and end (billing runs between them), where set."""
    times = {}
    for key, value in (("started_at", job.start_time), ("ended_at", job.end_time)):
        if value and value.timestamp() > 0:
            times[key] = value.isoformat()
    return times


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


@dataclass(frozen=True)
class VertexOptions:
    """Where and how the Vertex backend runs a CustomJob (`VertexLauncher`)."""

    backend: ClassVar[str] = "vertex"

    project: str
    """The Google Cloud project of the job."""
    location: str = DEFAULT_REGION
    """The region of the job."""
    job: CustomJobOptions = field(default_factory=CustomJobOptions)
    """The CustomJob's settings; a short `hf_token_secret` name is completed to
    `projects/<project>/secrets/NAME/versions/latest`."""
    gcp_resources_path: str | None = None
    """Where to write GCPC's gcp_resources JSON (the KFP output), if any; also read first, so a
    retried task follows the job it already started."""
    client: Any = None
    """An `aiplatform_v1.JobServiceClient` (default: one for `location`'s endpoint with
    Application Default Credentials); tests pass one with anonymous credentials."""
    poll_s: float = 30.0
    """Seconds between state polls."""
    retries: int = 8
    """Attempts per API call on transient errors, waiting `backoff_s` x 2^attempt (at most 5
    minutes) in between."""
    backoff_s: float = 5.0
    """The first wait between retries."""
    sleep: Callable[[float], None] = time.sleep
    """How to wait between retries (tests pass a recorder)."""

    def launcher(self, *, log: LogSink | None = None) -> VertexLauncher:
        """The launcher of these options' backend (`VertexLauncher`)."""
        return VertexLauncher(self, log=log)


class VertexLauncher(Launcher):
    """Runs the training as a Vertex AI CustomJob and follows it; `options` say where and how
    (`VertexOptions`), `log` is the sink for progress."""

    backend = "vertex"

    def __init__(self, options: VertexOptions, *, log: LogSink | None = None) -> None:
        super().__init__(log=log)
        if not options.project:
            raise ValueError("project is empty: pass the Google Cloud project for the Vertex job")
        self.project, self.location = options.project, options.location
        self.job_options = options.job
        if self.job_options.hf_token_secret:
            self.job_options = dataclasses.replace(
                self.job_options,
                hf_token_secret=secret_version_name(self.job_options.hf_token_secret, self.project),
            )
        self.gcp_resources_path = options.gcp_resources_path
        self.client = options.client or self._default_client(self.location)
        self.poll_s = options.poll_s
        self.retries, self.backoff_s, self._sleep = (
            options.retries,
            options.backoff_s,
            options.sleep,
        )
        self.job_name = ""

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
        # Replicas given GPUs stop at once if torch sees none (trainer/cuda_guard.py).
        gpus = self.job_options.accelerators(launch) if self.job_options.accelerator_type else 0
        options = dataclasses.replace(
            self.job_options, env={**expect_cuda_env(gpus), **self.job_options.env}
        )
        job = build_custom_job(launch=launch, options=options)
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
        # Flex-start queues the job (PENDING) until its machines are free, unbilled ("you don't
        # pay for the time that the job is in a queue"): its deadline, the budget's, counts from
        # when it first runs, like Vertex's own scheduling.timeout. Other capacities count from
        # here, provisioning included.
        clock_from = None if self.job_options.capacity == "flex-start" else started
        last = ""
        while True:
            job = self._get(self.job_name)
            state = job.state.name
            if state != last:
                self.log(f"[vertex] {self.job_name}: {state}")
                last = state
            if clock_from is None and state == "JOB_STATE_RUNNING":
                clock_from = time.monotonic()
            if state in TERMINAL:
                status = TERMINAL[state]
                message = state if not job.error.message else f"{state}: {job.error.message}"
                break
            if (
                timeout is not None
                and clock_from is not None
                and time.monotonic() - clock_from > timeout
            ):
                self.cancel()
                status, message = (
                    FAILED,
                    f"timed out after {timeout:.0f}s; cancelled {self.job_name}",
                )
                break
            time.sleep(self.poll_s)
        details = {"job": self.job_name, "state": state, **job_times(job)}
        return self.result(self.launch, status, message, started=started, details=details)

    def cancel(self) -> None:
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
