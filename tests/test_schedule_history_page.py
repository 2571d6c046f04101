"""`llmft history --html` in a real headless Chromium: the curves are drawn (issue 48)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chromium import CHROMIUM, run_chromium


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")
def test_history_page_draws_its_curves_in_chromium(tmp_path: Path) -> None:
    import numpy as np
    from matplotlib.image import imread
    from test_schedules import _three_runs
    from typer.testing import CliRunner

    from pipelines.cli import app

    work_uri, _ = _three_runs(tmp_path)
    page = tmp_path / "history.html"
    result = CliRunner().invoke(app, ["history", work_uri, "--html", str(page)])
    assert result.exit_code == 0, result.output
    dom = run_chromium(["--dump-dom", page.as_uri()], tmp_path / "profile-dom")
    assert dom.count('<figure data-curve="') == 4
    assert "skipped: nothing new" in dom and "refused (forgetting)" in dom
    shot = tmp_path / "history.png"
    run_chromium(
        [f"--screenshot={shot}", "--window-size=1000,900", "--hide-scrollbars", page.as_uri()],
        tmp_path / "profile-shot",
    )
    pixels = imread(str(shot))[..., :3]
    blue = np.array([0x1F, 0x6F, 0xEB]) / 255  # the curves' stroke and dots
    drawn = int((np.abs(pixels - blue).max(axis=-1) < 0.08).sum())
    assert drawn > 300, f"only {drawn} curve pixels in the screenshot"


def test_schedule_records_and_window_check_on_gs(gcs_emulator, tmp_path: Path) -> None:
    """The same records, controller and window check with work_uri and the window on gs://
    (a real GCS server: tests/gcs_fixtures.py)."""
    from test_schedules import _finish, _no_errors, _params

    from components.schedules import history, state
    from components.schedules.plan import plan_run
    from trainer import storage

    bucket = gcs_emulator.create_bucket("llmft-schedules")
    window = f"{bucket}/data/2026-12-01/*.jsonl"
    storage.write_text(
        f"{bucket}/data/2026-12-01/a.jsonl", '{"prompt": "p", "response": "r"}\n' * 5
    )
    params = _params(tmp_path, work_uri=f"{bucket}/work", min_new_records=1)
    plan, problems = plan_run(params, window, "run-1", "d1", _no_errors)
    assert problems == [] and plan.proceed and plan.record_uri.startswith(f"{bucket}/work/")
    versions = state.read_record(plan.record_uri)["window"]
    assert list(versions) == [f"{bucket}/data/2026-12-01/a.jsonl"]
    assert versions[f"{bucket}/data/2026-12-01/a.jsonl"]["version"]  # the object generation
    _finish(tmp_path, params, plan, retained=0.6, passed=True)
    plan, _ = plan_run(params, window, "run-2", "d1", _no_errors)
    assert not plan.proceed and "0 new records" in plan.message
    storage.write_text(
        f"{bucket}/data/2026-12-01/a.jsonl", '{"prompt": "p", "response": "r"}\n' * 6
    )
    plan, _ = plan_run(params, window, "run-3", "d1", _no_errors)
    assert plan.proceed  # a new generation that grew by one record
    root = history.schedules(f"{bucket}/work")[0]
    assert [r["run_id"] for r in state.runs(root)] == ["run-1", "run-2", "run-3"]
    assert state.read_controller(root)["share"] == 0.05  # retention 0.6 < 0.9: raised


def test_a_bigquery_window_counts_the_tables_growth(monkeypatch, tmp_path: Path) -> None:
    """bq:// windows: the table's row count and modification from its metadata (BigQuery's
    fake on loopback, tests/fakes/bigquery.py)."""
    from fakes.bigquery import FakeBigQuery
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery
    from test_schedules import _finish, _no_errors, _params

    from components.schedules import window
    from components.schedules.plan import plan_run

    uri = "bq://my-project.sft.events"
    rows = [{"prompt": f"p{i}", "response": "r"} for i in range(5)]
    params = _params(tmp_path, min_new_records=3)
    with FakeBigQuery("my-project.sft.events", rows) as fake:

        def client(project: str) -> bigquery.Client:
            options = ClientOptions(api_endpoint=fake.url)
            return bigquery.Client(project, AnonymousCredentials(), client_options=options)

        monkeypatch.setattr(window, "bigquery_client", client)
        plan, _ = plan_run(params, uri, "run-1", "d1", _no_errors)
        assert plan.proceed
        _finish(tmp_path, params, plan, retained=0.95, passed=True)
        fake.rows.extend({"prompt": f"n{i}", "response": "r"} for i in range(2))
        plan, _ = plan_run(params, uri, "run-2", "d2", _no_errors)
        assert not plan.proceed and plan.message.startswith("skipped: nothing new (2 new records")
        fake.rows.extend({"prompt": f"m{i}", "response": "r"} for i in range(2))
        plan, _ = plan_run(params, uri, "run-3", "d3", _no_errors)
        assert plan.proceed


def test_an_hf_window_compares_the_datasets_commit(monkeypatch, tmp_path: Path) -> None:
    """hf:// windows: the commit at the requested revision and the card's declared rows (the
    Hub's API on loopback, tests/fakes/hf_hub.py); a new commit without declared rows proceeds."""
    import huggingface_hub
    from fakes.hf_hub import FakeHub
    from huggingface_hub import constants as hub_constants
    from test_schedules import _finish, _no_errors, _params

    from components.schedules import state, window
    from components.schedules.plan import plan_run

    def info(sha: str, rows: int | None) -> dict:
        card = {"dataset_info": {"splits": [{"name": "train", "num_examples": rows}]}}
        return {"id": "acme/daily", "sha": sha, "cardData": card if rows else {}}

    uri = "hf://datasets/acme/daily:train"
    params = _params(tmp_path, min_new_records=3)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)  # the tests run offline
    with FakeHub({}, datasets={"acme/daily": info("a" * 40, 10)}) as hub:
        monkeypatch.setattr(window, "hub_api", lambda: huggingface_hub.HfApi(endpoint=hub.url))
        plan, _ = plan_run(params, uri, "run-1", "d1", _no_errors)
        assert plan.proceed
        assert state.read_record(plan.record_uri)["window"][uri]["version"] == "a" * 40
        _finish(tmp_path, params, plan, retained=0.95, passed=True)
        plan, _ = plan_run(params, uri, "run-2", "d2", _no_errors)  # the same commit
        assert not plan.proceed and plan.message.startswith("skipped: nothing new (0 new records")
        hub.datasets["acme/daily"] = info("b" * 40, 12)  # two rows more: too few
        plan, _ = plan_run(params, uri, "run-3", "d3", _no_errors)
        assert not plan.proceed and "(2 new records" in plan.message
        hub.datasets["acme/daily"] = info("c" * 40, None)  # a card that declares no rows
        plan, _ = plan_run(params, uri, "run-4", "d4", _no_errors)
        assert plan.proceed and state.read_record(plan.record_uri)["records_new"] is None
