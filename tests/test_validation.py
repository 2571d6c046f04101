"""Run-parameter validation: all errors at once, each saying what to change."""

from __future__ import annotations

import pytest

from components.validation import (
    SCHEDULE_TIME_PLACEHOLDER,
    run_parameter_errors,
    validate_and_resolve,
)

GOOD = dict(
    backend="local", train_data_uri="data.jsonl", data_kind="instruction", base_model="m",
    seq_len=512, eval_fraction=0.05, preprocess_runner="DirectRunner", nodes=2, nproc_per_node=2,
    rdzv_backend="etcd-v3", max_steps=10, learning_rate=1e-3, project="", region="", work_uri="",
    registered_model="", register_model=False, serving_image="", max_eval_examples=10,
)  # fmt: skip


def test_valid_parameters_have_no_errors():
    assert run_parameter_errors(**GOOD) == []


def test_all_errors_are_reported_together():
    bad = {**GOOD, "backend": "k8s", "nodes": 0, "seq_len": 4, "train_data_uri": " "}
    errors = run_parameter_errors(**bad)
    assert len(errors) == 4
    assert any("choose one of local, gke, vertex" in e for e in errors)
    with pytest.raises(ValueError, match="4 invalid run parameter"):
        validate_and_resolve(schedule_time="", **bad)


def test_cloud_runs_need_project_bucket_and_remote_data():
    errors = run_parameter_errors(**{**GOOD, "backend": "vertex"})
    joined = "\n".join(errors)
    assert (
        "project is empty" in joined
        and "work_uri" in joined
        and "upload the data to gs://" in joined
    )


def test_register_needs_a_pinned_serving_image_and_a_model_name():
    errors = run_parameter_errors(**{**GOOD, "register_model": True, "serving_image": "img:latest"})
    assert any("registered_model is empty" in e for e in errors)
    assert any("pin a version tag" in e for e in errors)


def test_schedule_time_fills_the_data_window():
    params = {**GOOD, "train_data_uri": f"gs://b/{SCHEDULE_TIME_PLACEHOLDER}/*.jsonl"}
    base, uri, champion = validate_and_resolve(
        schedule_time="2026-12-01T00:00:00Z", **{**params, "backend": "local"}
    )
    assert (base, uri, champion) == ("m", "gs://b/2026-12-01T00:00:00Z/*.jsonl", "")
    with pytest.raises(ValueError, match="not started by a schedule"):
        validate_and_resolve(schedule_time="", **params)


def test_champion_latest_registered_needs_a_model_name():
    with pytest.raises(ValueError, match="champion_model is 'latest-registered'"):
        validate_and_resolve(schedule_time="", champion_model="latest-registered", **GOOD)


def test_forgetting_threshold_is_a_fraction():
    assert run_parameter_errors(**GOOD, min_general_retained=0.9) == []
    errors = run_parameter_errors(**GOOD, min_general_retained=1.5)
    assert errors == ["min_general_retained=1.5: use a fraction in [0, 1] (0 disables)"]
