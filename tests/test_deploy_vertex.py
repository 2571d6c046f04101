"""Vertex AI: the CreatePipelineJob / CreateSchedule / UpdateSchedule requests the real aiplatform
SDK builds from our settings (anonymous credentials; only the GAPIC methods are replaced)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.vertex import FakeVertex
from goldens import without_timestamp
from google.auth.credentials import AnonymousCredentials

from pipelines.deploy.config import load_for
from pipelines.deploy.schedule import list_schedules, manage_schedule
from pipelines.deploy.schedule_vertex import create_vertex_schedule, update_vertex_schedules
from pipelines.deploy.submit import submit_vertex
from pipelines.deploy.template import SCHEDULE_TIME_PLACEHOLDER

PARENT = "projects/my-proj/locations/europe-west4"
SA = "llmft-pipelines@my-proj.iam.gserviceaccount.com"
DATA = f"gs://my-bucket/raw/{SCHEDULE_TIME_PLACEHOLDER}/*.jsonl"


@pytest.fixture
def vertex(monkeypatch: pytest.MonkeyPatch) -> FakeVertex:
    return FakeVertex(monkeypatch)


def _config(template: Path | str, **flags: Any) -> Any:
    settings: dict[str, Any] = dict(
        template=str(template),
        project="my-proj",
        region="europe-west4",
        pipeline_root="gs://my-bucket/pipeline-root",
        service_account=SA,
        parameters={"train_data_uri": DATA, "base_model": "latest-registered", "max_steps": 50},
    )
    settings.update(flags)
    return load_for("vertex", None, **settings)


def _params(pipeline_job: Any) -> dict[str, Any]:
    return dict(pipeline_job.runtime_config.parameter_values)


def _stable(request: Any) -> dict[str, Any]:
    """The request proto as JSON without what changes per submission or per KFP release: the
    generated job id and the compiled template (checked by the asserts and tests/test_compile.py)."""
    data = json.loads(
        type(request).to_json(
            request, use_integers_for_enums=False, always_print_fields_with_no_presence=False
        )
    )
    job = data.get("pipelineJob") or data["schedule"]["createPipelineJobRequest"]["pipelineJob"]
    job["pipelineSpec"] = "<the compiled template>"
    if "pipelineJobId" in data:
        data["pipelineJobId"] = without_timestamp(data["pipelineJobId"])
    return data


def test_submit_builds_the_pipeline_job_request(
    vertex: FakeVertex, templates: dict[str, Path], golden: Any
) -> None:
    from google.cloud.aiplatform_v1.types import PipelineFailurePolicy

    config = _config(
        templates["vertex"],
        network="projects/123456/global/networks/ml-vpc",
        labels={"team": "ml", "cost-center": "research"},
        experiment="llmft-exp",
        enable_caching=False,
        failure_policy="fast",
    )
    lines: list[str] = []
    submitted = submit_vertex(
        config,
        credentials=AnonymousCredentials(),
        schedule_time=dt.datetime(2026, 1, 5, 3, tzinfo=dt.UTC),
        wait=True,
        poll_seconds=0,
        report=lines.append,
    )
    (request,) = vertex.jobs
    golden.check("vertex_create_pipeline_job.json", _stable(request))
    job = request.pipeline_job
    assert request.parent == PARENT
    assert request.pipeline_job_id.startswith("llmft-fine-tune-")
    assert job.display_name == "llmft-fine-tune"
    assert job.service_account == SA
    assert job.network == "projects/123456/global/networks/ml-vpc"
    assert dict(job.labels) == {"team": "ml", "cost-center": "research"}
    assert job.runtime_config.gcs_output_directory == "gs://my-bucket/pipeline-root"
    assert (
        job.runtime_config.failure_policy == PipelineFailurePolicy.PIPELINE_FAILURE_POLICY_FAIL_FAST
    )
    assert _params(job) == {
        "train_data_uri": "gs://my-bucket/raw/2026-01-05T03:00:00Z/*.jsonl",
        "base_model": "latest-registered",
        "max_steps": 50,
        "backend": "vertex",  # the trainer runs as a Vertex CustomJob unless told otherwise
    }
    tasks = job.pipeline_spec["root"]["dag"]["tasks"]
    assert {t: tasks[t]["cachingOptions"].get("enableCache", False) for t in tasks} == {
        "validate": False,
        "train": False,
    }
    # The run was filed under the experiment: its run context became the experiment's child.
    assert vertex.experiment_children == [
        (
            f"{PARENT}/metadataStores/default/contexts/llmft-exp",
            [f"{PARENT}/pipelineJobs/{request.pipeline_job_id}-context"],
        )
    ]
    url = f"https://console.cloud.google.com/vertex-ai/locations/europe-west4/pipelines/runs/{request.pipeline_job_id}?project=my-proj"
    assert submitted.url == url
    assert submitted.state == "PIPELINE_STATE_SUCCEEDED"
    assert lines[0].startswith(f"submitted {PARENT}/pipelineJobs/")
    # Each state change is reported once (the experiment link may have seen RUNNING first).
    states = [line.split(" ", 1)[1] for line in lines[1:]]
    assert states[-1] == "PIPELINE_STATE_SUCCEEDED"
    assert len(states) == len(set(states))


def test_waiting_on_a_failed_run_is_an_error(
    vertex: FakeVertex, templates: dict[str, Path]
) -> None:
    vertex.states = ["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_FAILED"]
    config = _config(
        templates["vertex"], parameters={"train_data_uri": "gs://my-bucket/raw/*.jsonl"}
    )
    with pytest.raises(
        ValueError, match=r"ended PIPELINE_STATE_FAILED: see https://console.cloud.google.com/"
    ):
        submit_vertex(
            config,
            credentials=AnonymousCredentials(),
            wait=True,
            poll_seconds=0,
            report=lambda _: None,
        )


def test_nothing_is_sent_when_the_config_or_template_is_wrong(
    vertex: FakeVertex, templates: dict[str, Path]
) -> None:
    with pytest.raises(ValueError, match="kfp-kubernetes platform config"):
        submit_vertex(
            _config(templates["kfp"], parameters={"train_data_uri": "gs://b/raw/*.jsonl"}),
            credentials=AnonymousCredentials(),
        )
    with pytest.raises(ValueError, match="parameter 'max_step' is not in"):
        submit_vertex(
            _config(templates["vertex"], parameters={"max_step": 1}),
            credentials=AnonymousCredentials(),
        )
    assert vertex.jobs == []


def test_schedule_builds_the_create_schedule_request(
    vertex: FakeVertex, templates: dict[str, Path], golden: Any
) -> None:
    from google.cloud.aiplatform_v1.types import Schedule

    config = _config(
        templates["vertex"],
        cron="CRON_TZ=Europe/Berlin 0 3 * * MON",
        display_name="weekly-fine-tune",
        max_concurrent_runs=1,
        start_time="2026-01-05T00:00:00Z",
        end_time="2026-12-31T00:00:00Z",
        max_run_count=52,
    )
    config.schedule.display_name = "weekly-fine-tune"
    scheduled = create_vertex_schedule(
        config, credentials=AnonymousCredentials(), report=lambda _: None
    )
    (request,) = vertex.created_schedules
    golden.check("vertex_create_schedule.json", _stable(request))
    schedule = request.schedule
    assert request.parent == PARENT
    assert schedule.display_name == "weekly-fine-tune"
    assert schedule.cron == "CRON_TZ=Europe/Berlin 0 3 * * MON"
    assert schedule.max_concurrent_run_count == 1
    assert schedule.max_run_count == 52
    assert schedule.start_time.isoformat() == "2026-01-05T00:00:00+00:00"
    assert schedule.end_time.isoformat() == "2026-12-31T00:00:00+00:00"
    job_request = schedule.create_pipeline_job_request
    assert job_request.parent == PARENT
    assert job_request.pipeline_job.service_account == SA
    # The placeholder stays in the stored parameters: each scheduled run resolves its own window.
    assert _params(job_request.pipeline_job)["train_data_uri"] == DATA
    assert _params(job_request.pipeline_job)["base_model"] == "latest-registered"
    assert scheduled.name in vertex.schedules
    assert vertex.schedules[scheduled.name].state == Schedule.State.ACTIVE
    assert scheduled.url.endswith(
        f"/pipelines/schedules/{scheduled.name.rsplit('/', 1)[1]}/detail?project=my-proj"
    )


def test_update_repoints_schedules_at_the_new_template(
    vertex: FakeVertex, templates: dict[str, Path], tmp_path: Path
) -> None:
    config = _config(templates["vertex"], cron="0 3 * * 1")
    config.schedule.display_name = "weekly-fine-tune"
    created = create_vertex_schedule(
        config, credentials=AnonymousCredentials(), report=lambda _: None
    )

    # A new template version: same pipeline, one default changed.
    spec = yaml.safe_load(templates["vertex"].read_text())
    spec["root"]["inputDefinitions"]["parameters"]["learning_rate"]["defaultValue"] = 2e-4
    new_template = tmp_path / "fine_tune.v2.yaml"
    new_template.write_text(yaml.safe_dump(spec))

    update = load_for(
        "vertex",
        None,
        template=str(new_template),
        project="my-proj",
        region="europe-west4",
        parameters={"max_steps": 80},
    )
    update.schedule.display_name = "weekly-fine-tune"
    updated = update_vertex_schedules(
        update, credentials=AnonymousCredentials(), report=lambda _: None
    )
    assert [u.name for u in updated] == [created.name]
    (request,) = vertex.updates
    assert list(request.update_mask.paths) == ["create_pipeline_job_request"]
    assert request.schedule.name == created.name
    job = request.schedule.create_pipeline_job_request.pipeline_job
    assert (
        job.pipeline_spec["root"]["inputDefinitions"]["parameters"]["learning_rate"]["defaultValue"]
        == 2e-4
    )
    # Kept from the schedule: its window placeholder, service account, pipeline root.
    assert _params(job) == {
        "train_data_uri": DATA,
        "base_model": "latest-registered",
        "max_steps": 80,
        "backend": "vertex",
    }
    assert job.service_account == SA
    assert job.runtime_config.gcs_output_directory == "gs://my-bucket/pipeline-root"
    assert ("list_schedules", 'display_name="weekly-fine-tune"') in vertex.calls

    update.schedule.display_name = "no-such-schedule"
    with pytest.raises(ValueError, match="no pipeline schedule named 'no-such-schedule'"):
        update_vertex_schedules(update, credentials=AnonymousCredentials(), report=lambda _: None)


def test_list_pause_resume_delete(vertex: FakeVertex, templates: dict[str, Path]) -> None:
    config = _config(templates["vertex"], cron="@daily")
    created = create_vertex_schedule(
        config, credentials=AnonymousCredentials(), report=lambda _: None
    )
    schedule_id = created.name.rsplit("/", 1)[1]
    rows = list_schedules(config, "vertex", credentials=AnonymousCredentials())
    assert [(r.name, r.state, r.cron) for r in rows] == [(created.name, "ACTIVE", "0 0 * * *")]
    for action in ("pause", "resume", "delete"):
        manage_schedule(
            config,
            "vertex",
            action,
            schedule_id,
            credentials=AnonymousCredentials(),
            report=lambda _: None,
        )  # type: ignore[arg-type]
    assert vertex.calls[-3:] == [
        ("pause_schedule", created.name),
        ("resume_schedule", created.name),
        ("delete_schedule", created.name),
    ]
    with pytest.raises(
        ValueError, match=r"pause .*/schedules/999: not found .*check project, location and name"
    ):
        manage_schedule(
            config,
            "vertex",
            "pause",
            "999",
            credentials=AnonymousCredentials(),
            report=lambda _: None,
        )


def test_the_compiled_vertex_template_makes_a_valid_request(vertex: FakeVertex) -> None:
    template = Path("compiled/fine_tune.vertex.yaml")
    if not template.exists():
        pytest.skip("compiled/fine_tune.vertex.yaml not generated yet (llmft compile)")
    config = _config(
        template,
        parameters={
            "train_data_uri": "gs://my-bucket/raw/*.jsonl",
            "base_model": "latest-registered",
            "dataflow_service_account": "llmft-dataflow@my-proj.iam.gserviceaccount.com",
        },
    )
    # The pipeline's own first-step checks run before submission, with the template's defaults.
    with pytest.raises(ValueError, match="registered_model is empty"):
        submit_vertex(config, credentials=AnonymousCredentials(), report=lambda _: None)
    assert vertex.jobs == []
    config.parameters["registered_model"] = "llmft-assistant"
    submit_vertex(config, credentials=AnonymousCredentials(), report=lambda _: None)
    (request,) = vertex.jobs
    assert request.pipeline_job.pipeline_spec["pipelineInfo"]["name"] == "llmft-fine-tune"
    params = _params(request.pipeline_job)
    # Filled from the deploy settings: where the trainer runs and where shared run files go.
    assert (params["backend"], params["project"], params["region"]) == (
        "vertex",
        "my-proj",
        "europe-west4",
    )
    assert params["work_uri"] == "gs://my-bucket/pipeline-root/llmft-work"


def test_a_registry_template_is_fetched_checked_and_recorded(
    vertex: FakeVertex, templates: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--template <registry>/<package>/<tag>`: the template comes from Artifact Registry (the
    HTTP fetch is served locally), is checked like a local one, and the job records its URI."""
    import io
    import urllib.request

    uri = "https://europe-west4-kfp.pkg.dev/my-proj/llmft-pipelines/llmft-fine-tune/v0.1.0"
    fetched: list[str] = []

    def urlopen(request: urllib.request.Request, *args: Any, **kwargs: Any) -> io.BytesIO:
        fetched.append(request.full_url)
        assert request.full_url == uri
        return io.BytesIO(templates["vertex"].read_bytes())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(ValueError, match="parameter 'max_step' is not in"):
        submit_vertex(
            _config(uri, parameters={"train_data_uri": "gs://b/x", "max_step": 1}),
            credentials=AnonymousCredentials(),
        )
    config = _config(uri, parameters={"train_data_uri": "gs://b/x"})
    submit_vertex(config, credentials=AnonymousCredentials(), report=lambda _: None)
    (request,) = vertex.jobs
    assert request.pipeline_job.template_uri == uri
    assert request.pipeline_job.pipeline_spec["pipelineInfo"]["name"] == "llmft-fine-tune"
    assert fetched  # fetched through the SDK's registry loader, not read from disk
