"""Recurring runs (components/schedules/): the retention controller's rule and its state across
runs (a failed run included), replay sources, the unchanged-window check, the run records the
validate and evaluate steps write, and `llmft history`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from components.schedules import controller, replay, state, window
from components.schedules.controller import CAP, STEP_UP_MIN, next_share, retention
from components.schedules.finish import finish_run, report_section
from components.schedules.plan import plan_run


def test_retention_is_the_lowest_the_gate_checks():
    assert retention({"general_retained": 0.9}) == 0.9
    metrics = {"general_retained": 0.95, "base_task_arc": 0.5, "tuned_task_arc": 0.4}
    assert retention(metrics) == pytest.approx(0.8)
    assert retention({"base_eval_loss": 2.0}) is None


def test_the_rule_doubles_to_a_cap_and_lowers_slowly_to_the_floor():
    up = next_share(0.0, floor=0.0, target=0.9, retained=0.7)
    assert up.share == STEP_UP_MIN and "raised" in up.reason
    assert next_share(0.1, floor=0.0, target=0.9, retained=0.7).share == 0.2
    assert next_share(0.4, floor=0.0, target=0.9, retained=0.7).share == CAP
    assert next_share(CAP, floor=0.0, target=0.9, retained=0.1).share == CAP
    refused = next_share(0.1, floor=0.0, target=0.9, retained=None, refused_for_forgetting=True)
    assert refused.share == 0.2
    down = next_share(0.2, floor=0.05, target=0.9, retained=0.99)
    assert down.share == pytest.approx(0.16) and "lowered" in down.reason
    assert next_share(0.06, floor=0.05, target=0.9, retained=0.99).share == 0.05
    assert next_share(0.2, floor=0.0, target=0.9, retained=0.92).share == 0.2  # near: kept
    assert next_share(0.3, floor=0.1, target=0.0, retained=0.1).share == 0.1  # no target


def _params(tmp_path: Path, **changes):
    values = dict(
        work_uri=str(tmp_path / "work"),
        train_data_uri=str(tmp_path / "{{$.pipeline_job_schedule_time_utc}}" / "*.jsonl"),
        registered_model="m",
        register_model=False,
        project="",
        region="us-central1",
        replay_fraction=0.0,
        replay_source="general",
        retention_target=0.0,
        min_general_retained=0.9,
        min_new_records=0,
        train_data_mix="",
    )
    values.update(changes)
    return SimpleNamespace(**values)


def _window(tmp_path: Path, name: str, records: int) -> str:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "a.jsonl").write_text(
        "".join(f'{{"prompt": "{i}", "response": "r"}}\n' for i in range(records))
    )
    return str(folder / "*.jsonl")


def _no_errors(_uri: str) -> list[str]:
    return []


def _finish(tmp_path, params, plan, retained: float, passed: bool):
    checks = [{"name": "general_retained", "passed": retained >= params.min_general_retained}]
    return finish_run(
        plan.record_uri,
        params,
        metrics={"general_retained": retained, "base_eval_loss": 2.0, "tuned_eval_loss": 1.5},
        passed=passed,
        checks=checks,
    )


def test_the_controller_state_survives_runs_and_a_failed_one(tmp_path: Path):
    params = _params(tmp_path, replay_fraction=0.05)
    # run 1 forgets: the gate refuses, the next run's replay doubles
    plan, problems = plan_run(params, _window(tmp_path, "d1", 20), "run-1", "d1", _no_errors)
    assert problems == [] and plan.proceed and plan.replay_fraction == 0.05
    assert json.loads(plan.train_data_mix)[0] == {"uri": "train", "weight": 0.95}
    ctl = _finish(tmp_path, params, plan, retained=0.6, passed=False)
    assert ctl["share"] == 0.1 and "forgetting" in ctl["reason"]
    # run 2 starts and fails before evaluation: nothing moves
    plan2, _ = plan_run(params, _window(tmp_path, "d2", 20), "run-2", "d2", _no_errors)
    assert plan2.replay_fraction == 0.1
    # run 3 starts from the same state, forgets again: 0.2
    plan3, _ = plan_run(params, _window(tmp_path, "d3", 20), "run-3", "d3", _no_errors)
    assert plan3.replay_fraction == 0.1
    ctl = _finish(tmp_path, params, plan3, retained=0.8, passed=False)
    assert ctl["share"] == 0.2
    # run 4 retains comfortably: lowered slowly
    plan4, _ = plan_run(params, _window(tmp_path, "d4", 20), "run-4", "d4", _no_errors)
    ctl = _finish(tmp_path, params, plan4, retained=0.99, passed=True)
    assert ctl["share"] == pytest.approx(0.16)
    assert [h["run_id"] for h in ctl["history"]] == ["run-1", "run-3", "run-4"]
    root = str(Path(plan.record_uri).parent.parent)
    records = {r["run_id"]: r for r in state.runs(root)}
    assert records["run-2"]["status"] == state.STARTED  # the failed run stays visible
    assert records["run-4"]["status"] == state.FINISHED and records["run-4"]["passed"]
    assert records["run-3"]["refused_for_forgetting"] is True
    assert "Retention controller" in report_section(ctl) and "0.160" in report_section(ctl)


def test_an_unchanged_window_is_skipped_and_a_grown_one_is_not(tmp_path: Path):
    params = _params(tmp_path, min_new_records=5)
    uri = _window(tmp_path, "d1", 20)
    plan, _ = plan_run(params, uri, "run-1", "d1", _no_errors)
    assert plan.proceed  # no successful run yet
    _finish(tmp_path, params, plan, retained=0.95, passed=True)
    plan, _ = plan_run(params, uri, "run-2", "d1", _no_errors)
    assert not plan.proceed and plan.message.startswith("skipped: nothing new (0 new records")
    assert state.read_record(plan.record_uri)["status"] == state.SKIPPED
    with open(Path(uri).parent / "a.jsonl", "a") as f:  # three more records: still too few
        f.write("".join(f'{{"prompt": "n{i}", "response": "r"}}\n' for i in range(3)))
    plan, _ = plan_run(params, uri, "run-3", "d1", _no_errors)
    assert not plan.proceed and "(3 new records" in plan.message
    (Path(uri).parent / "b.jsonl").write_text('{"prompt": "x", "response": "y"}\n' * 4)
    plan, _ = plan_run(params, uri, "run-4", "d1", _no_errors)
    assert plan.proceed and state.read_record(plan.record_uri)["records_new"] == 7


def test_window_counts_by_format(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.csv").write_text("prompt,response\nq,a\nq2,a2\n")
    (tmp_path / "b.json").write_text('[{"text": "x"}, {"text": "y"}, {"text": "z"}]')
    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "c.parquet")
    listing = window.list_window(f"{tmp_path}/*.csv,{tmp_path}/*.json,{tmp_path}/*.parquet")
    total, counted = window.new_records(listing, {})
    assert total == 7 and {v["records"] for v in counted.values()} == {2, 3}
    assert window.listable("hf://datasets/a/b") and not window.listable("")


def test_replay_sources_resolve_and_missing_ones_are_refused(tmp_path: Path):
    records = [
        {"status": "finished", "passed": True, "window_uri": "w1"},
        {"status": "finished", "passed": False, "window_uri": "w2"},
        {"status": "finished", "passed": True, "window_uri": "w3"},
    ]
    uris, warnings = replay.resolve("general,previous:2,gs://b/x.jsonl", records)
    assert uris == [str(replay.GENERAL_PATH), "w3", "w1", "gs://b/x.jsonl"] and not warnings
    assert replay.GENERAL_PATH.exists()
    uris, warnings = replay.resolve("previous", [])
    assert uris == [] and "no earlier successful run" in warnings[0]
    assert replay.syntax_errors("previous:0") and not replay.syntax_errors("previous:3")
    params = _params(tmp_path, replay_fraction=0.1, replay_source=str(tmp_path / "nope.jsonl"))

    def missing(uri: str) -> list[str]:
        return [f"train_data_uri={uri!r} matches no file: check the path or glob"]

    plan, problems = plan_run(params, _window(tmp_path, "d1", 3), "r", "", missing)
    assert problems == [
        f"replay source {str(tmp_path / 'nope.jsonl')!r} matches no file: check the path or glob"
    ]
    assert not plan.proceed


def test_schedule_key_is_the_template_not_the_window():
    a = state.schedule_key("gs://b/{{$.pipeline_job_schedule_time_utc}}/*.jsonl", "m")
    assert a == state.schedule_key("gs://b/{{$.pipeline_job_schedule_time_utc}}/*.jsonl", "m")
    assert a != state.schedule_key("gs://b/{{$.pipeline_job_schedule_time_utc}}/*.jsonl", "n")
    assert state.schedule_root("", a) == ""
    assert controller.CAP <= 0.5


def _three_runs(tmp_path: Path) -> tuple[str, str]:
    params = _params(tmp_path, replay_fraction=0.05, min_new_records=1)
    plan, _ = plan_run(params, _window(tmp_path, "d1", 10), "run-1", "d1", _no_errors)
    _finish(tmp_path, params, plan, retained=0.6, passed=False)
    d2 = _window(tmp_path, "d2", 10)
    plan, _ = plan_run(params, d2, "run-2", "d2", _no_errors)
    _finish(tmp_path, params, plan, retained=0.95, passed=True)
    plan, _ = plan_run(params, d2, "run-3", "d2", _no_errors)
    assert not plan.proceed
    return params.work_uri, str(Path(plan.record_uri).parent.parent.name)


def test_history_prints_one_row_per_run_and_writes_a_page(tmp_path: Path):
    from typer.testing import CliRunner

    from pipelines.cli import app

    work_uri, key = _three_runs(tmp_path)
    page = tmp_path / "history.html"
    result = CliRunner().invoke(app, ["history", work_uri, "--html", str(page)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"schedule {key}: 3 runs"
    assert lines[1].split()[:4] == ["when", "run", "new", "read"]
    rows = [line for line in lines if "run-" in line]
    assert len(rows) == 3
    assert "refused (forgetting)" in rows[0] and "0.050" in rows[0]
    assert "passed" in rows[1] and "yes" in rows[1] and "0.100" in rows[1]
    assert "skipped: nothing new" in rows[2]
    text = page.read_text()
    assert text.count("<tr>") == 4 and 'data-curve="retention"' in text
    assert text.count("<circle") >= 2 + 2 + 3  # loss and retention of two runs, replay of three
    bad = CliRunner().invoke(app, ["history", str(tmp_path / "none")])
    assert bad.exit_code == 2 and bad.output.startswith("error: no schedule records")


def test_the_local_build_reports_an_unchanged_window_without_skipping(tmp_path: Path):
    params = _params(tmp_path, min_new_records=5)
    uri = _window(tmp_path, "d1", 20)
    plan, _ = plan_run(params, uri, "run-1", "d1", _no_errors)
    _finish(tmp_path, params, plan, retained=0.95, passed=True)
    plan, _ = plan_run(params, uri, "run-2", "d1", _no_errors, can_skip=False)
    assert plan.proceed and plan.message.startswith("note: the local runner does not skip")
    assert state.read_record(plan.record_uri)["status"] == state.STARTED


def test_the_mix_may_name_the_window_as_written(tmp_path: Path):
    params = _params(tmp_path)
    params.train_data_mix = f"{params.train_data_uri}=0.75,{_window(tmp_path, 'g', 3)}=0.25"
    plan, problems = plan_run(params, _window(tmp_path, "d1", 5), "run-1", "d1", _no_errors)
    assert problems == []
    assert json.loads(plan.train_data_mix)[0] == {"uri": "train", "weight": 0.75}


def test_history_reads_which_run_became_champion_from_the_registry(
    tmp_path: Path, fake_registry, golden
):
    """Runs that register their models: the champion column comes from Model Registry (the
    versions' run labels and the `champion` alias; Vertex faked at its API: tests/fakes/vertex.py),
    and the requests history sends are a reviewed golden file."""
    from test_serving import _proto_json, _register
    from typer.testing import CliRunner

    from pipelines.cli import app

    params = _params(
        tmp_path, register_model=True, registered_model="Tiny Llama FT", project="my-project"
    )
    outcomes = {"run-1": (0.6, False), "run-2": (0.95, True), "run-3": (0.97, True)}
    outcomes["run-4"] = (0.96, True)  # passed, but its register step never ran (it failed)
    for number, (run, (retained, passed)) in enumerate(outcomes.items(), start=1):
        plan, _ = plan_run(
            params, _window(tmp_path, f"d{number}", 5), run, f"d{number}", _no_errors
        )
        assert state.read_record(plan.record_uri)["registry"] == {
            "model": "Tiny Llama FT", "project": "my-project", "region": "us-central1",
        }  # fmt: skip
        _finish(tmp_path, params, plan, retained=retained, passed=passed)
        if passed and run != "run-4":  # the register step: a new version, the alias moved
            _register(run, {"tuned_eval_loss": 1.2, "passed": 1.0})
    fake_registry.requests.clear()
    result = CliRunner().invoke(app, ["history", params.work_uri])
    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line for line in result.output.splitlines() if " run-" in line}
    assert "v1 (was champion)" in rows["run-2"] and "v2 (champion now)" in rows["run-3"]
    assert rows["run-4"].rstrip().endswith("not registered")
    assert rows["run-1"].split()[-2:] == ["(forgetting)", "-"]
    golden.check("vertex_history_requests.json", [_proto_json(r) for r in fake_registry.requests])
    # Without the registry the table says what the gate decided.
    offline = CliRunner().invoke(app, ["history", params.work_uri, "--no-registry"])
    assert "not registered" not in offline.output and "champion now" not in offline.output
