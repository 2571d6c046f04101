"""Vertex launcher: the exact CustomJob request (built with aiplatform_v1 types and sent by a real
JobServiceClient with anonymous credentials over its REST transport, answered at the HTTP boundary),
gcp_resources, the wait loop over job states, cancel on SIGTERM, cleanup by label, and the replica
command run for real (two local "replicas" rendezvousing at the primary like on Vertex)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fakes.recording import FakeHttp, Recorded, Router
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1

from components.launchers import TrainLaunch
from components.launchers.customjob import CustomJobOptions, build_custom_job
from components.launchers.vertex import VertexLauncher, VertexOptions
from components.runtime.ports import ReservedPort
from trainer.config import TrainConfig

RUN = "fine-tune-20261202-abc"
PARENT = "projects/p/locations/us-central1"
JOBS = f"/v1/{PARENT}/customJobs"
JOB = f"{PARENT}/customJobs/123"
WORKER = str(Path(__file__).parent / "launcher_workers" / "dist_worker.py")


def launch(**kw: Any) -> TrainLaunch:
    args = dict(
        run_id=RUN,
        trainer=TrainConfig(
            model="gs://b/models/llama-7b", data="gs://b/data", output="gs://b/out", max_steps=100
        ),
        nodes=4,
        nproc_per_node=8,
        rdzv_backend="c10d",
    )
    return TrainLaunch(**(args | kw))


def vertex(router: Router, **kw: Any) -> tuple[VertexLauncher, list[str]]:
    client = aiplatform_v1.JobServiceClient(
        credentials=AnonymousCredentials(),
        transport="rest",
        client_options={"api_endpoint": "us-central1-aiplatform.googleapis.com"},
    )
    client._transport._session.mount("https://", FakeHttp(router))
    lines: list[str] = []
    kw.setdefault(
        "job",
        CustomJobOptions(
            machine_type="a3-highgpu-8g",
            service_account="trainer@p.iam.gserviceaccount.com",
            network="projects/42/global/networks/vpc",
            reserved_ip_ranges=("training-range",),
            timeout_s=3600,
        ),
    )
    options = VertexOptions(project="p", location="us-central1", client=client, poll_s=0.01, **kw)
    return VertexLauncher(options, log=lines.append), lines


def no_previous_jobs(router: Router) -> None:
    """The run-label lookup a first attempt makes finds nothing."""
    router.on("GET", JOBS, (200, {}))


def job_json(state: str, message: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"name": JOB, "displayName": f"llmft-train-{RUN}", "state": state}
    if message:
        body["error"] = {"code": 3, "message": message}
    return body


def test_custom_job_proto_has_two_pools_and_the_rendezvous_at_the_primary() -> None:
    job = build_custom_job(
        launch=launch(),
        options=CustomJobOptions(env={"WANDB_MODE": "offline"}, boot_disk_size_gb=1000),
    )
    primary, workers = job.job_spec.worker_pool_specs
    assert (primary.replica_count, workers.replica_count) == (1, 3)
    assert primary.machine_spec == aiplatform_v1.MachineSpec(
        machine_type="a3-highgpu-8g",
        accelerator_type=aiplatform_v1.AcceleratorType.NVIDIA_H100_80GB,
        accelerator_count=8,
    )
    assert primary.disk_spec == aiplatform_v1.DiskSpec(
        boot_disk_type="pd-ssd", boot_disk_size_gb=1000
    )
    script = primary.container_spec.command[2]
    assert "--rdzv-conf=is_host=1" in script and "is_host=0" in workers.container_spec.command[2]
    assert f'--rdzv-backend=c10d --rdzv-endpoint="$RDZV" --rdzv-id={RUN}' in script
    assert "-m trainer --config-json '{" in script and '"model":"gs://b/models/llama-7b"' in script
    assert {e.name: e.value for e in primary.container_spec.env} == {
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONUNBUFFERED": "1",
        "WANDB_MODE": "offline",
    }
    assert job.labels == {"managed-by": "llmft", "llmft-run-id": RUN}
    assert len(build_custom_job(launch=launch(nodes=1)).job_spec.worker_pool_specs) == 1
    with pytest.raises(ValueError) as err:
        build_custom_job(
            launch=launch(rdzv_backend="etcd-v3"), options=CustomJobOptions(accelerator_type="H100")
        )
    assert "use c10d" in str(err.value) and "accelerator_type='H100'" in str(err.value)


def test_create_request_gcp_resources_and_success(tmp_path: Path, golden: Any) -> None:
    router = Router()
    no_previous_jobs(router)
    router.on(
        "POST", JOBS, lambda req: (200, {**req.body, "name": JOB, "state": "JOB_STATE_QUEUED"})
    )
    router.on(
        "GET",
        f"/v1/{JOB}",
        (200, job_json("JOB_STATE_PENDING")),
        (200, job_json("JOB_STATE_RUNNING")),
        (200, job_json("JOB_STATE_SUCCEEDED")),
    )
    gcp_resources = tmp_path / "gcp_resources"
    launcher, lines = vertex(router, gcp_resources_path=str(gcp_resources))
    result = launcher.run(launch(), timeout=30)

    assert result.ok and result.details["job"] == JOB
    [create] = router.sent("POST", JOBS)
    golden.check("vertex_create_custom_job_a3.json", create.body)
    # The wire body parses back with the SDK's own type (no unknown field).
    aiplatform_v1.CustomJob.from_json(json.dumps(create.body))
    assert create.body["jobSpec"]["reservedIpRanges"] == ["training-range"]
    assert create.body["jobSpec"]["scheduling"]["timeout"] == "3600s"
    assert json.loads(gcp_resources.read_text()) == {
        "resources": [
            {
                "resourceType": "CustomJob",
                "resourceUri": f"https://us-central1-aiplatform.googleapis.com/v1/{JOB}",
            }
        ]
    }
    assert [line.split(": ")[-1] for line in lines if line.startswith(f"[vertex] {JOB}")] == [
        "JOB_STATE_PENDING",
        "JOB_STATE_RUNNING",
        "JOB_STATE_SUCCEEDED",
    ]


@pytest.mark.parametrize(
    ("state", "error", "status"),
    [
        (
            "JOB_STATE_FAILED",
            "The replica workerpool1-0 exited with a non-zero status of 1.",
            "failed",
        ),
        ("JOB_STATE_CANCELLED", "", "cancelled"),
        ("JOB_STATE_EXPIRED", "", "failed"),
    ],
)
def test_terminal_states(state: str, error: str, status: str) -> None:
    router = Router()
    no_previous_jobs(router)
    router.on("POST", JOBS, lambda req: (200, {**req.body, "name": JOB}))
    router.on(
        "GET", f"/v1/{JOB}", (200, job_json("JOB_STATE_RUNNING")), (200, job_json(state, error))
    )
    launcher, _ = vertex(router)
    result = launcher.run(launch(), timeout=30)
    assert result.status == status and state in result.message and error in result.message


def test_sigterm_cancels_the_job() -> None:
    def running(req: Recorded) -> tuple[int, dict]:
        os.kill(os.getpid(), signal.SIGTERM)
        return 200, job_json("JOB_STATE_RUNNING")

    router = Router()
    no_previous_jobs(router)
    router.on("POST", JOBS, lambda req: (200, {**req.body, "name": JOB}))
    router.on("GET", f"/v1/{JOB}", running)
    router.on("POST", f"/v1/{JOB}:cancel", (200, {}))
    launcher, _ = vertex(router)
    result = launcher.run(launch(), timeout=30)
    assert result.status == "cancelled"
    assert len(router.sent("POST", f"/v1/{JOB}:cancel")) == 1


def test_cleanup_cancels_active_jobs_with_the_run_label() -> None:
    router = Router()
    router.on(
        "GET",
        JOBS,
        (
            200,
            {
                "customJobs": [
                    {"name": f"{PARENT}/customJobs/1", "state": "JOB_STATE_RUNNING"},
                    {"name": f"{PARENT}/customJobs/2", "state": "JOB_STATE_SUCCEEDED"},
                    {"name": f"{PARENT}/customJobs/3", "state": "JOB_STATE_PENDING"},
                ]
            },
        ),
    )
    router.on("POST", f"/v1/{PARENT}/customJobs/1:cancel", (200, {}))
    router.on(
        "POST",
        f"/v1/{PARENT}/customJobs/3:cancel",
        (
            400,
            {
                "error": {
                    "code": 400,
                    "message": "already finished",
                    "status": "FAILED_PRECONDITION",
                }
            },
        ),
    )
    launcher, _ = vertex(router)
    assert launcher.cleanup(RUN) == [f"CustomJob {PARENT}/customJobs/1"]
    [listing] = router.sent("GET", JOBS)
    assert listing.query["filter"] == f'labels.llmft-run-id="{RUN}"'
    assert not router.sent("POST", f"/v1/{PARENT}/customJobs/2:cancel")


@pytest.mark.slow
@pytest.mark.integration  # two real processes form a gloo group
def test_replica_commands_rendezvous_at_the_primary(tmp_path: Path) -> None:
    """Run the primary's and the worker pool's command as two local processes with the
    CLUSTER_SPEC Vertex would set: they must form one 2-process group."""
    job = build_custom_job(
        launch=launch(
            nodes=2,
            nproc_per_node=1,
            trainer=TrainConfig(model="m", data="d", output=str(tmp_path)),
            entrypoint=(WORKER,),
        ),
        options=CustomJobOptions(machine_type="n2-standard-8", accelerator_type=None),
    )
    port = ReservedPort()  # held until the primary's c10d store listens on it
    spec = {"cluster": {"workerpool0": [port.endpoint], "workerpool1": ["127.0.0.1:1"]}}
    env = {
        **os.environ,
        "CLUSTER_SPEC": json.dumps(spec),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    env.pop("MASTER_ADDR", None)
    # torchrun without --log-dir makes a temp dir (fine in a Vertex container); keep it in tmp_path.
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")
    procs = [
        subprocess.Popen(
            list(pool.container_spec.command),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pool in job.job_spec.worker_pool_specs
    ]
    with port:
        outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert json.loads((tmp_path / "summary.json").read_text())["world_size"] == 2


def test_retried_task_follows_the_job_named_in_gcp_resources(tmp_path: Path) -> None:
    """GCPC's check_if_job_exists: a retry reads gcp_resources and never creates a second job."""
    gcp_resources = tmp_path / "gcp_resources"
    gcp_resources.write_text(
        json.dumps(
            {
                "resources": [
                    {
                        "resourceType": "CustomJob",
                        "resourceUri": f"https://us-central1-aiplatform.googleapis.com/v1/{JOB}",
                    }
                ]
            }
        )
    )
    router = Router()
    router.on(
        "GET",
        f"/v1/{JOB}",
        (200, job_json("JOB_STATE_RUNNING")),
        (200, job_json("JOB_STATE_RUNNING")),
        (200, job_json("JOB_STATE_SUCCEEDED")),
    )
    launcher, lines = vertex(router, gcp_resources_path=str(gcp_resources))
    assert launcher.run(launch(), timeout=30).ok
    assert router.sent("POST", JOBS) == [] and router.sent("GET", JOBS) == []
    assert any("started by a previous attempt" in line for line in lines)


def test_retried_task_finds_its_job_by_the_run_label() -> None:
    """gcp_resources was never written (the attempt died right after create): the run label
    finds the job; a failed older job is not followed."""
    older = f"{PARENT}/customJobs/100"
    router = Router()
    router.on(
        "GET",
        JOBS,
        (
            200,
            {
                "customJobs": [
                    {
                        "name": JOB,
                        "state": "JOB_STATE_RUNNING",
                        "createTime": "2026-12-02T10:00:00Z",
                    },
                    {
                        "name": older,
                        "state": "JOB_STATE_FAILED",
                        "createTime": "2026-12-02T09:00:00Z",
                    },
                ]
            },
        ),
    )
    router.on("GET", f"/v1/{JOB}", (200, job_json("JOB_STATE_SUCCEEDED")))
    launcher, _ = vertex(router)
    result = launcher.run(launch(), timeout=30)
    assert result.ok and result.details["job"] == JOB
    assert router.sent("POST", JOBS) == []
    [listing] = router.sent("GET", JOBS)
    assert listing.query["filter"] == f'labels.llmft-run-id="{RUN}"'


def test_a_failed_job_from_a_previous_attempt_is_replaced(tmp_path: Path) -> None:
    gcp_resources = tmp_path / "gcp_resources"
    uri = "https://us-central1-aiplatform.googleapis.com/v1/" + f"{PARENT}/customJobs/100"
    gcp_resources.write_text(
        json.dumps({"resources": [{"resourceType": "CustomJob", "resourceUri": uri}]})
    )
    router = Router()
    router.on(
        "GET", f"/v1/{PARENT}/customJobs/100", (200, {"name": "x", "state": "JOB_STATE_FAILED"})
    )
    router.on("POST", JOBS, lambda req: (200, {**req.body, "name": JOB}))
    router.on("GET", f"/v1/{JOB}", (200, job_json("JOB_STATE_SUCCEEDED")))
    launcher, _ = vertex(router, gcp_resources_path=str(gcp_resources))
    assert launcher.run(launch(), timeout=30).ok
    assert len(router.sent("POST", JOBS)) == 1
    assert JOB in gcp_resources.read_text()


UNAVAILABLE = (503, {"error": {"code": 503, "message": "try again", "status": "UNAVAILABLE"}})


def test_transient_errors_while_polling_are_retried_with_backoff() -> None:
    router = Router()
    no_previous_jobs(router)
    router.on("POST", JOBS, lambda req: (200, {**req.body, "name": JOB}))
    router.on(
        "GET",
        f"/v1/{JOB}",
        (200, job_json("JOB_STATE_RUNNING")),
        UNAVAILABLE,
        UNAVAILABLE,
        (200, job_json("JOB_STATE_SUCCEEDED")),
    )
    waits: list[float] = []
    launcher, _ = vertex(router, backoff_s=1.0, sleep=waits.append)
    assert launcher.run(launch(), timeout=30).ok
    assert waits == [1.0, 2.0]


def test_a_launcher_that_fails_cancels_the_job_it_started() -> None:
    router = Router()
    no_previous_jobs(router)
    router.on("POST", JOBS, lambda req: (200, {**req.body, "name": JOB}))
    router.on("GET", f"/v1/{JOB}", UNAVAILABLE)
    router.on("POST", f"/v1/{JOB}:cancel", (200, {}))
    launcher, _lines = vertex(router, retries=3, backoff_s=0.0, sleep=lambda s: None)
    from google.api_core import exceptions

    with pytest.raises(exceptions.ServiceUnavailable):
        launcher.run(launch(), timeout=30)
    assert len(router.sent("GET", f"/v1/{JOB}")) == 3
    assert len(router.sent("POST", f"/v1/{JOB}:cancel")) == 1


def test_the_hf_token_is_read_at_run_time_by_secret_name(tmp_path: Path, golden: Any) -> None:
    """The create request (golden file, reviewed) names the secret; no token value anywhere."""
    router = Router()
    no_previous_jobs(router)
    router.on("POST", JOBS, lambda req: (200, {**req.body, "name": JOB}))
    router.on("GET", f"/v1/{JOB}", (200, job_json("JOB_STATE_SUCCEEDED")))
    launcher, _ = vertex(
        router,
        job=CustomJobOptions(
            machine_type="g2-standard-24",
            accelerator_type="NVIDIA_L4",
            service_account="trainer@p.iam.gserviceaccount.com",
            hf_token_secret="llmft-hf-token",
        ),
    )
    assert launcher.run(launch(nodes=2, nproc_per_node=2), timeout=30).ok
    [create] = router.sent("POST", JOBS)
    golden.check("vertex_create_custom_job.json", create.body)
    with pytest.raises(ValueError, match="must not carry the HF token"):
        build_custom_job(launch=launch(), options=CustomJobOptions(env={"HF_TOKEN": "x"}))


@pytest.mark.parametrize(
    ("machine", "accelerator", "count", "expected"),
    [
        ("a3-highgpu-8g", "NVIDIA_L4", 8, "use g2-standard-96"),
        ("a3-highgpu-8g", "NVIDIA_H100_80GB", 4, "use a3-highgpu-4g"),
        ("g2-standard-24", "NVIDIA_L4", 1, "it carries 2 x NVIDIA_L4"),
        ("a3-highgpu-8g", None, None, "set accelerator_type=NVIDIA_H100_80GB"),
        ("n2-standard-8", "NVIDIA_L4", 1, "it carries no GPUs"),
    ],
)
def test_machine_and_accelerator_are_cross_checked_before_anything_is_created(
    machine: str, accelerator: str | None, count: int | None, expected: str
) -> None:
    """N15: Vertex rejects these at create_custom_job, after Dataflow has been paid for."""
    with pytest.raises(ValueError, match="invalid Vertex CustomJob options") as err:
        build_custom_job(
            launch=launch(nodes=2, nproc_per_node=count or 1),
            options=CustomJobOptions(
                machine_type=machine, accelerator_type=accelerator, accelerator_count=count
            ),
        )
    assert expected in str(err.value)
    ok = CustomJobOptions(machine_type="g2-standard-24", accelerator_type="NVIDIA_L4")
    assert build_custom_job(launch=launch(nodes=2, nproc_per_node=2), options=ok)


@pytest.mark.parametrize(
    ("capacity", "status"), [("flex-start", "succeeded"), ("on-demand", "failed")]
)
def test_flex_start_deadline_does_not_count_the_queue(
    monkeypatch: pytest.MonkeyPatch, capacity: str, status: str
) -> None:
    """Review P5: a flex-start job waits PENDING for its machines, unbilled; the deadline (the
    budget's) counts from its first RUNNING. Each poll below advances a fake clock by 1000 s:
    3000 s queued then 1000 s running fits a 1500 s timeout on flex-start, while on-demand
    still counts from the call (provisioning included) and cancels."""
    import types

    from components.launchers import vertex as vertex_module

    clock = [0.0]

    def poll(state: str) -> Any:
        def answer(req: Recorded) -> tuple[int, dict]:
            clock[0] += 1000.0
            return 200, job_json(state)

        return answer

    monkeypatch.setattr(
        vertex_module,
        "time",
        types.SimpleNamespace(monotonic=lambda: clock[0], sleep=lambda s: None),
    )
    router = Router()
    no_previous_jobs(router)
    router.on("POST", JOBS, lambda req: (200, {**req.body, "name": JOB}))
    router.on(
        "GET",
        f"/v1/{JOB}",
        *[
            poll(s)
            for s in ("JOB_STATE_PENDING",) * 3 + ("JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED")
        ],
    )
    router.on("POST", f"/v1/{JOB}:cancel", (200, {}))
    job = CustomJobOptions(
        machine_type="a3-highgpu-8g",
        capacity=capacity,
        max_wait_s=7200 if capacity == "flex-start" else None,
        timeout_s=3600,
    )
    launcher, _ = vertex(router, job=job)
    result = launcher.run(launch(), timeout=1500)
    assert result.status == status, result.message
    assert len(router.sent("POST", f"/v1/{JOB}:cancel")) == (status == "failed")


def test_secret_env_reaches_the_replicas_by_name_and_is_read_at_start() -> None:
    """The MLflow token (any `secret_env`): the job spec holds the secret version's name as
    `<ENV>_SECRET`, never a value; each replica's script reads it before torchrun starts."""
    version = "projects/p/secrets/mlflow-token/versions/latest"
    job = build_custom_job(
        launch=launch(nodes=2, nproc_per_node=1),
        options=CustomJobOptions(
            machine_type="n2-standard-8",
            accelerator_type=None,
            secret_env={"MLFLOW_TRACKING_TOKEN": version},
        ),
    )
    for pool in job.job_spec.worker_pool_specs:
        env = {e.name: e.value for e in pool.container_spec.env}
        assert env["MLFLOW_TRACKING_TOKEN_SECRET"] == version
        assert "MLFLOW_TRACKING_TOKEN" not in env
        script = pool.container_spec.command[-1]
        read = 'MLFLOW_TRACKING_TOKEN="$(python -m components.runtime.secrets "$MLFLOW_TRACKING_TOKEN_SECRET")"'
        assert read in script and script.index(read) < script.index("exec python -m torch")
    for options, fragment in [
        ({"secret_env": {"MLFLOW_TRACKING_TOKEN": "mlflow-token"}}, "secret version's resource"),
        (
            {"secret_env": {"T": version}, "env": {"T": "value"}},
            "T is in both env and secret_env",
        ),
    ]:
        with pytest.raises(ValueError, match=fragment):
            build_custom_job(launch=launch(), options=CustomJobOptions(**options))
