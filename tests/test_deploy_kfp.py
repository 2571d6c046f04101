"""KFP on GKE: the real kfp.Client against a recording KFP API on 127.0.0.1, and the
Artifact Registry upload through the real RegistryClient against a recording endpoint."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kfp_api import FakeKfp, FakeRegistry
from goldens import without_timestamp

from pipelines.deploy.clients import kfp_client
from pipelines.deploy.config import load_for
from pipelines.deploy.schedule import list_schedules, manage_schedule
from pipelines.deploy.schedule_kfp import create_kfp_schedule, update_kfp_schedules
from pipelines.deploy.submit import submit_kfp
from pipelines.deploy.template import SCHEDULE_TIME_PLACEHOLDER
from pipelines.deploy.upload import default_tags, upload_to_kfp, upload_to_registry

DATA = f"gs://my-bucket/raw/{SCHEDULE_TIME_PLACEHOLDER}/*.jsonl"


def _config(server: FakeKfp, template: Path | None, **flags: Any) -> Any:
    settings: dict[str, Any] = dict(
        template=str(template) if template else None,
        host=server.url,
        service_account="llmft-pipeline",
        pipeline_root="gs://my-bucket/kfp-root",
        parameters={"train_data_uri": DATA, "max_steps": 40},
    )
    settings.update(flags)
    return load_for("kfp", None, **settings)


def test_upload_creates_the_pipeline_then_adds_versions(
    kfp_api: FakeKfp, templates: dict[str, Path], tmp_path: Path
) -> None:
    config = _config(kfp_api, templates["kfp"])
    client = kfp_client(config.kfp)
    first = upload_to_kfp(templates["kfp"], client, pipeline_name="llmft-fine-tune")
    assert first.created_pipeline
    (upload,) = kfp_api.calls("POST", "/apis/v2beta1/pipelines/upload")
    assert upload.query["name"] == "llmft-fine-tune"
    assert upload.files["uploadfile"] == templates["kfp"].read_bytes()

    # The first upload's version is named after the pipeline (KFP's rule); ours carry the
    # template digest, so the same bytes cannot be uploaded twice by accident.
    sha = hashlib.sha256(templates["kfp"].read_bytes()).hexdigest()
    named = upload_to_kfp(templates["kfp"], client, pipeline_name="llmft-fine-tune")
    assert named.version_name == f"v0.1.0-{sha[:8]}"
    with pytest.raises(ValueError, match=f"already has version v0.1.0-{sha[:8]} .*--version-name"):
        upload_to_kfp(templates["kfp"], client, pipeline_name="llmft-fine-tune")

    changed = tmp_path / "fine_tune.kfp.yaml"
    changed.write_bytes(templates["kfp"].read_bytes() + b"\n# rebuilt\n")
    second = upload_to_kfp(changed, client, pipeline_name="llmft-fine-tune", description="v2")
    digest = hashlib.sha256(changed.read_bytes()).hexdigest()
    assert not second.created_pipeline
    assert second.pipeline_id == first.pipeline_id
    version_uploads = kfp_api.calls("POST", "/apis/v2beta1/pipelines/upload_version")
    assert [
        (c.query["pipelineid"], c.query["name"], c.query.get("description"))
        for c in version_uploads
    ] == [
        (first.pipeline_id, f"v0.1.0-{sha[:8]}", None),
        (first.pipeline_id, f"v0.1.0-{digest[:8]}", "v2"),
    ]
    assert version_uploads[1].files["uploadfile"] == changed.read_bytes()


def _stable(body: dict[str, Any]) -> dict[str, Any]:
    """A request body without what changes per submission or per KFP release: the timestamp in
    the generated display name, and the compiled template (checked by the asserts and by
    tests/test_compile.py)."""
    stable = dict(body)
    stable["display_name"] = without_timestamp(stable["display_name"])
    if "pipeline_spec" in stable:
        stable["pipeline_spec"] = "<the compiled template>"
    return stable


def test_run_submits_into_the_experiment_and_follows_it(
    kfp_api: FakeKfp, templates: dict[str, Path], golden: Any
) -> None:
    import datetime as dt

    config = _config(kfp_api, templates["kfp"], experiment="weekly", enable_caching=False)
    lines: list[str] = []
    submitted = submit_kfp(
        config,
        schedule_time=dt.datetime(2026, 1, 5, 3, tzinfo=dt.UTC),
        wait=True,
        poll_seconds=0,
        report=lines.append,
    )
    (experiment,) = kfp_api.calls("POST", "/apis/v2beta1/experiments")
    assert experiment.body["display_name"] == "weekly"
    (run,) = kfp_api.calls("POST", "/apis/v2beta1/runs")
    body = run.body
    assert body["experiment_id"] == next(iter(kfp_api.experiments))
    assert body["display_name"].startswith("llmft-fine-tune-")
    assert body["service_account"] == "llmft-pipeline"
    assert body["runtime_config"] == {
        "parameters": {
            "train_data_uri": "gs://my-bucket/raw/2026-01-05T03:00:00Z/*.jsonl",
            "max_steps": 40,
            "backend": "gke",  # the trainer runs as a PyTorchJob on the KFP cluster
        },
        "pipeline_root": "gs://my-bucket/kfp-root",
    }
    spec = body["pipeline_spec"]
    assert spec["pipeline_spec"]["pipelineInfo"]["name"] == "llmft-fine-tune"
    assert "kubernetes" in spec["platform_spec"]["platforms"]  # the kfp target's secret mount
    caching = [
        t["cachingOptions"].get("enableCache")
        for t in spec["pipeline_spec"]["root"]["dag"]["tasks"].values()
    ]
    assert caching == [None, None]  # enable_caching=False clears every task's cache flag
    golden.check("kfp_create_run.json", _stable(body))
    assert submitted.url == f"{kfp_api.url}/#/runs/details/{submitted.run_id}"
    assert submitted.state == "SUCCEEDED"
    assert [line.split(" ", 1)[1] for line in lines[1:]] == ["RUNNING", "SUCCEEDED"]


def test_run_of_an_uploaded_version(kfp_api: FakeKfp, templates: dict[str, Path]) -> None:
    config = _config(
        kfp_api,
        None,
        pipeline_id="p-1",
        version_id="v-7",
        parameters={"train_data_uri": "gs://b/x"},
    )
    submit_kfp(config, report=lambda _: None)
    (run,) = kfp_api.calls("POST", "/apis/v2beta1/runs")
    assert run.body["pipeline_version_reference"] == {
        "pipeline_id": "p-1",
        "pipeline_version_id": "v-7",
    }
    assert "pipeline_spec" not in run.body
    assert run.body["runtime_config"]["parameters"] == {
        "train_data_uri": "gs://b/x",
        "backend": "gke",
    }


WHEN = dt.datetime(2026, 1, 5, 3, tzinfo=dt.UTC)


@pytest.mark.parametrize("tag", ["2.14.0", "2.15.0", "v2.4.1"])
def test_a_backend_older_than_the_floor_is_refused_before_anything_is_sent(
    kfp_api: FakeKfp, templates: dict[str, Path], tag: str
) -> None:
    """N7: KFP before 2.16 silently drops settings the compiled YAML relies on (the optional
    Secret, securityContext, the schedule-time placeholder); the healthz probe names the release."""
    kfp_api.tag_name = tag
    config = _config(kfp_api, templates["kfp"], cron="0 3 * * 1")
    config.schedule.display_name = "weekly-fine-tune"
    for attempt in (
        lambda: submit_kfp(config, schedule_time=WHEN, report=lambda _: None),
        lambda: create_kfp_schedule(config, report=lambda _: None),
    ):
        with pytest.raises(ValueError, match=rf"is backend {tag}; .* needs 2\.16\.0 or later"):
            attempt()
    assert [r.method for r in kfp_api.requests] == ["GET", "GET"]  # only the probes
    # Listing and deleting what an old backend holds still works.
    assert list_schedules(config, "kfp", display_name="weekly-fine-tune") == []


def test_a_gpu_node_that_cannot_host_evaluate_is_refused_before_anything_is_sent(
    kfp_api: FakeKfp,
) -> None:
    """Review P1: the GPU-node check runs for every run and schedule, not only `--dry-run`: on a
    g2-standard-4 pool the evaluate pod would stay Pending after training was paid for."""
    compiled = Path(__file__).resolve().parents[1] / "compiled" / "fine_tune.kfp.yaml"
    config = _config(kfp_api, compiled, cron="0 3 * * 1")
    config.parameters.update(
        base_model="gs://my-bucket/m", project="my-project", work_uri="gs://my-bucket/w",
        dataflow_service_account="llmft-dataflow@my-project.iam.gserviceaccount.com",
        service_account="llmft-trainer", machine_type="g2-standard-4",
        accelerator_type="NVIDIA_L4", accelerator_count=1,
    )  # fmt: skip
    config.schedule.display_name = "weekly-fine-tune"
    for attempt in (
        lambda: submit_kfp(config, schedule_time=WHEN, report=lambda _: None),
        lambda: create_kfp_schedule(config, report=lambda _: None),
    ):
        with pytest.raises(ValueError, match=r"g2-standard-4.*the evaluate task requests 4 CPU"):
            attempt()
    assert kfp_api.requests == []


@pytest.mark.parametrize("tag", ["2.16.0", "2.17.0", "unknown", None])
def test_a_current_or_unreported_backend_is_accepted(kfp_api: FakeKfp, tag: str | None) -> None:
    from pipelines.deploy.clients import kfp_backend_error

    assert kfp_backend_error(kfp_api.url, tag) is None
    kfp_api.tag_name = tag  # type: ignore[assignment]
    assert kfp_client(_config(kfp_api, None).kfp) is not None


def test_schedule_translates_cron_and_keeps_the_placeholder(
    kfp_api: FakeKfp, templates: dict[str, Path], golden: Any
) -> None:
    config = _config(
        kfp_api,
        templates["kfp"],
        cron="0 3 * * 1",
        max_concurrent_runs=1,
        start_time="2026-01-05T00:00:00Z",
        end_time="2026-12-31T00:00:00Z",
        max_run_count=10,
    )
    config.schedule.display_name = "weekly-fine-tune"
    lines: list[str] = []
    scheduled = create_kfp_schedule(config, report=lines.append)
    assert (
        lines[0]
        == "KFP cron '0 0 3 * * 1': translated from '0 3 * * 1' (KFP takes six fields, seconds first)"
    )
    assert (
        lines[1]
        == "warning: schedule.max_run_count is ignored on KFP (no such setting; use end_time)"
    )
    (request,) = kfp_api.calls("POST", "/apis/v2beta1/recurringruns")
    body = request.body
    golden.check("kfp_create_recurring_run.json", _stable(body))
    assert body["display_name"] == "weekly-fine-tune"
    assert body["trigger"] == {
        "cron_schedule": {
            "cron": "0 0 3 * * 1",
            "start_time": "2026-01-05T00:00:00Z",
            "end_time": "2026-12-31T00:00:00Z",
        }
    }
    assert body["max_concurrency"] == 1
    assert body["no_catchup"] is True
    assert body["mode"] == "ENABLE"
    assert body["service_account"] == "llmft-pipeline"
    assert body["runtime_config"]["parameters"] == {
        "train_data_uri": DATA,
        "max_steps": 40,
        "backend": "gke",
    }
    assert scheduled.url == f"{kfp_api.url}/#/recurringrun/details/{scheduled.name}"


def test_schedule_refuses_a_time_zone_kfp_cannot_honour(
    kfp_api: FakeKfp, templates: dict[str, Path]
) -> None:
    config = _config(kfp_api, templates["kfp"], cron="CRON_TZ=Europe/Berlin 0 3 * * 1")
    with pytest.raises(
        ValueError, match=r"schedule.cron: KFP recurring runs have no per-schedule time zone"
    ):
        create_kfp_schedule(config, report=lambda _: None)
    assert kfp_api.requests == []  # refused before connecting


def test_list_pause_resume_delete_and_update(
    kfp_api: FakeKfp, templates: dict[str, Path], tmp_path: Path
) -> None:
    config = _config(kfp_api, templates["kfp"], cron="0 3 * * 1", catchup=True)
    config.schedule.display_name = "weekly-fine-tune"
    old = create_kfp_schedule(config, report=lambda _: None)
    manage_schedule(config, "kfp", "pause", old.name, report=lambda _: None)
    rows = list_schedules(config, "kfp", display_name="weekly-fine-tune")
    assert [(r.name, r.cron) for r in rows] == [(old.name, "0 0 3 * * 1")]
    assert json.loads(kfp_api.calls("GET", "/apis/v2beta1/recurringruns")[-1].query["filter"]) == {
        "predicates": [
            {"operation": "EQUALS", "key": "display_name", "stringValue": "weekly-fine-tune"}
        ]
    }

    spec_docs = list(yaml.safe_load_all(templates["kfp"].read_text()))
    spec_docs[0]["root"]["inputDefinitions"]["parameters"]["max_steps"]["defaultValue"] = 300
    new_template = tmp_path / "fine_tune.kfp.v2.yaml"
    new_template.write_text(yaml.safe_dump_all(spec_docs))
    update = _config(kfp_api, new_template, parameters={"max_steps": 60})
    update.schedule.display_name = "weekly-fine-tune"
    (new,) = update_kfp_schedules(update, report=lambda _: None)

    replacement = kfp_api.calls("POST", "/apis/v2beta1/recurringruns")[-1].body
    assert replacement["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * 1"
    assert replacement["no_catchup"] is False
    assert replacement["mode"] == "DISABLE"  # it was paused, and stays paused
    assert replacement["runtime_config"]["parameters"] == {
        "train_data_uri": DATA,
        "max_steps": 60,
        "backend": "gke",
    }
    default = replacement["pipeline_spec"]["pipeline_spec"]["root"]["inputDefinitions"][
        "parameters"
    ]["max_steps"]
    assert default["defaultValue"] == 300
    assert kfp_api.calls("DELETE", f"/apis/v2beta1/recurringruns/{old.name}")
    assert list(kfp_api.recurring) == [new.name]

    manage_schedule(config, "kfp", "resume", new.name, report=lambda _: None)
    manage_schedule(config, "kfp", "delete", new.name, report=lambda _: None)
    assert kfp_api.recurring == {}
    with pytest.raises(
        ValueError,
        match=r"pause recurring run gone: KFP API answered 404 .*recurring run gone not found",
    ):
        manage_schedule(config, "kfp", "pause", "gone", report=lambda _: None)


def test_registry_upload_tags_and_returns_the_sha256_version(templates: dict[str, Path]) -> None:
    with FakeRegistry() as registry:
        uploaded = upload_to_registry(templates["vertex"], registry.url + "/")
        (request,) = registry.requests
    digest = hashlib.sha256(templates["vertex"].read_bytes()).hexdigest()
    assert default_tags() == ["v0.1.0", "latest"]
    assert request.body == {"tags": "v0.1.0,latest"}
    assert request.files["content"] == templates["vertex"].read_bytes()
    assert uploaded.package == "llmft-fine-tune"
    assert uploaded.version == f"sha256:{digest}"
    assert uploaded.uri == f"{registry.url}/llmft-fine-tune/sha256:{digest}"
    with pytest.raises(ValueError, match="kfp-kubernetes platform config"):
        upload_to_registry(templates["kfp"], registry.url)
    with pytest.raises(ValueError, match=r"tags \['sha256:abc'\] are not valid registry tags"):
        upload_to_registry(templates["vertex"], registry.url, tags=["sha256:abc"])


@pytest.mark.parametrize("root", [None, "minio://mlpipeline/v2/artifacts"])
def test_gke_training_needs_a_gs_pipeline_root_before_anything_starts(
    kfp_api: FakeKfp, templates: dict[str, Path], root: str | None
) -> None:
    """PyTorchJob pods read the run's artifacts by URI; KFP's default MinIO root is out of reach."""
    config = _config(kfp_api, templates["kfp"], pipeline_root=root)
    with pytest.raises(ValueError, match="backend=gke on KFP needs a gs:// pipeline root"):
        submit_kfp(config)
    assert kfp_api.calls("POST", "/apis/v2beta1/runs") == []
