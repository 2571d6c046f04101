"""Deploy settings, cron syntax and template parameters: checked before anything is sent."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from pipelines.deploy.checks import validate
from pipelines.deploy.config import flag_overrides, load_config, load_for
from pipelines.deploy.cron import parse_cron
from pipelines.deploy.submit import prepare_parameters
from pipelines.deploy.template import (
    SCHEDULE_TIME_PLACEHOLDER,
    check_for_backend,
    fill_schedule_time,
    parameter_errors,
    read_template,
)


@pytest.mark.parametrize(
    ("written", "vertex", "kfp"),
    [
        ("0 3 * * 1", "0 3 * * 1", "0 0 3 * * 1"),
        ("CRON_TZ=UTC  0 3 * * 1", "CRON_TZ=UTC 0 3 * * 1", "0 0 3 * * 1"),
        (
            "TZ=Etc/UTC */15 8-18 * * MON-FRI",
            "CRON_TZ=Etc/UTC */15 8-18 * * MON-FRI",
            "0 */15 8-18 * * MON-FRI",
        ),
        ("@weekly", "0 0 * * 0", "0 0 0 * * 0"),
        ("30 2 1,15 JAN-JUN 7", "30 2 1,15 JAN-JUN 7", "0 30 2 1,15 JAN-JUN 0"),
        ("0 4 * * 5-7", "0 4 * * 5-7", "0 0 4 * * 5-6,0"),
    ],
)
def test_cron_translates_to_six_fields_for_kfp(written: str, vertex: str, kfp: str) -> None:
    cron = parse_cron(written)
    assert cron.to_vertex() == vertex
    assert cron.to_kfp() == kfp


def test_cron_keeps_time_zone_for_vertex_and_refuses_it_for_kfp() -> None:
    cron = parse_cron("CRON_TZ=Europe/Berlin 0 3 * * 1")
    assert cron.to_vertex() == "CRON_TZ=Europe/Berlin 0 3 * * 1"
    with pytest.raises(ValueError, match=r"no per-schedule time zone.*CRON_SCHEDULE_TIMEZONE"):
        cron.to_kfp()


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("0 0 3 * * 1", "6 fields.*seconds-first"),
        ("0 3 * *", "4 fields"),
        ("61 3 * * *", "minute value 61 is outside 0-59"),
        ("0 3 * 13 *", "month value 13 is outside 1-12"),
        ("0 3 * * FUNDAY", "day-of-week value 'FUNDAY' is not a number or one of SUN/"),
        ("0 3 */0 * *", "step '0'"),
        ("0 5-3 * * *", "runs backwards"),
        ("CRON_TZ=Mars/Olympus 0 3 * * *", "unknown time zone 'Mars/Olympus'"),
    ],
)
def test_cron_errors_say_what_to_write(written: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cron(written)


def test_cron_reports_every_field_error_at_once() -> None:
    with pytest.raises(ValueError) as err:
        parse_cron("99 25 0 * *")
    assert all(
        f in str(err.value) for f in ("minute value 99", "hour value 25", "day-of-month value 0")
    )


def test_config_reports_all_problems_together(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "template: compiled/missing.yaml\n"
        "paramters: {max_steps: 5}\n"  # typo: unknown key
        "vertex:\n"
        "  project: My_Project\n"
        "  pipeline_root: /local/dir\n"
        "  labels: {Team: ML}\n"
        "  failure_policy: sometimes\n"
        "  enable_caching: 'no'\n"
        "schedule:\n"
        "  cron: '0 3 * *'\n"
        "  max_concurrent_runs: 0\n"
        "  start_time: 2026-02-01T00:00:00Z\n"
        "  end_time: 2026-01-01T00:00:00Z\n"
    )
    with pytest.raises(ValueError) as err:
        load_config(path)
    first = str(err.value)
    # Structural problems first (unknown keys, wrong types), each with what is allowed.
    assert "2 config problem(s)" in first
    assert "paramters: unknown key (known: display_name, kfp, parameters" in first
    assert "vertex.enable_caching: expected bool or null, got 'no'" in first

    path.write_text(path.read_text().replace("paramters", "parameters").replace("'no'", "false"))
    config = load_config(path)
    assert config.schedule.start_time == "2026-02-01T00:00:00Z"  # YAML timestamps stay RFC 3339
    with pytest.raises(ValueError) as err:
        validate(config, "vertex", "schedule")
    message = str(err.value)
    for expected in (
        "template: compiled/missing.yaml does not exist (run `llmft compile`)",
        "vertex.project: 'My_Project' is not a project id",
        "vertex.pipeline_root: '/local/dir' must start with gs://",
        "vertex.labels: Team=ML",
        "vertex.failure_policy: 'sometimes' must be fast or slow",
        "schedule.cron: cron '0 3 * *' has 4 fields",
        "schedule.max_concurrent_runs: must be at least 1",
        "schedule.end_time: must be after schedule.start_time",
    ):
        assert expected in message, expected
    assert message.startswith("8 config problem(s)")


def test_flags_override_the_file_and_land_in_the_chosen_backend(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "parameters: {max_steps: 5, base_model: latest-registered}\n"
        "vertex: {project: file-project, labels: {team: ml}, service_account: a@b.iam.gserviceaccount.com}\n"
        "kfp: {service_account: from-file}\n"
    )
    config = load_for(
        "vertex",
        path,
        project="flag-project",
        parameters={"max_steps": 9},
        labels={"env": "prod"},
        service_account="llmft-runner@flag-project.iam.gserviceaccount.com",
        host=None,
    )
    assert config.vertex.project == "flag-project"
    assert config.parameters == {"max_steps": 9, "base_model": "latest-registered"}
    assert config.vertex.labels == {"team": "ml", "env": "prod"}
    assert config.vertex.service_account == "llmft-runner@flag-project.iam.gserviceaccount.com"
    assert config.kfp.service_account == "from-file"  # the other backend's section is untouched
    assert config.template == "compiled/fine_tune.vertex.yaml"
    with pytest.raises(ValueError, match=r"with --backend kfp, drop: --project \(vertex only\)"):
        flag_overrides("kfp", project="p", host="http://h")


def test_parameters_are_checked_against_the_template(templates: dict[str, Path]) -> None:
    info = read_template(templates["vertex"])
    assert info.name == "llmft-fine-tune"
    assert not info.kubernetes_platform
    assert read_template(templates["kfp"]).kubernetes_platform
    errors = parameter_errors(info, {"max_step": 5, "learning_rate": "fast", "max_steps": True})
    assert errors == [
        "parameter 'max_step' is not in fine_tune.vertex.yaml (known: backend, base_model, "
        "learning_rate, max_steps, train_data_uri)",
        "parameter 'learning_rate' wants NUMBER_DOUBLE, got 'fast'",
        "parameter 'max_steps' wants NUMBER_INTEGER, got True",
        "parameter 'train_data_uri' is required (Raw records; may carry the schedule-time placeholder.)",
    ]
    with pytest.raises(ValueError, match=r"kfp-kubernetes platform config.*use the vertex target"):
        check_for_backend(read_template(templates["kfp"]), "vertex")


def test_schedule_time_placeholder_is_filled_for_one_off_runs(templates: dict[str, Path]) -> None:
    from kfp import dsl

    assert SCHEDULE_TIME_PLACEHOLDER == dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER
    uri = f"gs://bucket/raw/{SCHEDULE_TIME_PLACEHOLDER}/*.jsonl"
    when = dt.datetime(2026, 1, 5, 4, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert fill_schedule_time({"train_data_uri": uri, "max_steps": 3}, when) == {
        "train_data_uri": "gs://bucket/raw/2026-01-05T03:00:00Z/*.jsonl",
        "max_steps": 3,
    }
    config = load_for(
        "vertex", None, template=str(templates["vertex"]), parameters={"train_data_uri": uri}
    )
    with pytest.raises(ValueError, match="one-off run has no scheduled time: pass --schedule-time"):
        prepare_parameters(config, "vertex", schedule_time=None, recurring=False)
    # A schedule keeps the placeholder: the pipeline resolves it per run.
    kept = prepare_parameters(config, "vertex", schedule_time=None, recurring=True)
    assert kept == {"train_data_uri": uri, "backend": "vertex"}
    # The compiled default trainer backend is `local`; cloud runs must not inherit it.
    config.parameters["backend"] = "local"
    with pytest.raises(ValueError, match="backend=local runs the trainer on this machine"):
        prepare_parameters(config, "kfp", schedule_time=None, recurring=True)


def test_each_backend_gets_its_own_parameters_over_the_shared_ones(tmp_path: Path) -> None:
    """Shared `parameters`, then the backend's own section, then --param: the trainer's identity
    is an email on Vertex and a Kubernetes name on KFP, from one file."""
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "parameters: {max_steps: 5, service_account: shared}\n"
        "vertex: {parameters: {service_account: t@p.iam.gserviceaccount.com}}\n"
        "kfp: {parameters: {service_account: llmft-trainer, nodes: 4}}\n"
    )
    vertex = load_for("vertex", path)
    assert vertex.parameters == {"max_steps": 5, "service_account": "t@p.iam.gserviceaccount.com"}
    kfp = load_for("kfp", path, parameters={"nodes": 2})
    assert kfp.parameters == {"max_steps": 5, "service_account": "llmft-trainer", "nodes": 2}
    assert load_for("kfp", path).parameters["nodes"] == 4
