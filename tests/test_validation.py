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


# -- named checks (issue 13) ---------------------------------------------------------------------

from components.validation import (  # noqa: E402
    check_backend_for_target,
    check_dataflow_service_account,
    check_eval_accelerator,
    check_not_a_token,
    check_nproc_per_node,
    check_pipeline_root,
    check_placeholder_resolved,
    check_service_account,
    resolve_nproc_per_node,
)

TOKEN = "hf_" + "aBcD1234" * 5


def test_a_token_is_refused_in_any_parameter_and_never_echoed():
    errors = run_parameter_errors(
        **{**GOOD, "hf_token_secret": TOKEN, "trainer_overrides": {"hub_token": TOKEN}}
    )
    assert sum("looks like a Hugging Face token" in e for e in errors) == 2
    assert not any(TOKEN in e for e in errors)
    assert check_not_a_token("hf_token_secret", "llmft-hf-token") is None


def test_local_backend_only_from_the_local_runner():
    assert check_backend_for_target("local", "local") is None
    for target in ("vertex", "kfp"):
        assert "cannot run from a" in (check_backend_for_target("local", target) or "")
        assert check_backend_for_target("gke", target) is None
    assert check_backend_for_target("local", "") is None  # target unknown (a direct call)


def test_one_process_per_gpu():
    assert check_nproc_per_node("vertex", 0, 8) is None
    assert check_nproc_per_node("gke", 8, 8) is None
    assert "set nproc_per_node to 8 or 0" in (check_nproc_per_node("vertex", 2, 8) or "")
    assert check_nproc_per_node("local", 2, 8) is None  # no GPUs locally
    assert resolve_nproc_per_node("vertex", 0, 8) == 8
    assert resolve_nproc_per_node("gke", 0, 0) == 1
    assert resolve_nproc_per_node("local", 0, 8) == 1
    assert resolve_nproc_per_node("local", 2, 8) == 2


def test_identities_are_checked_per_backend():
    assert check_service_account("vertex", "") is None  # the Custom Code Service Agent
    assert check_service_account("vertex", "trainer@my-proj.iam.gserviceaccount.com") is None
    assert "service-account email" in (check_service_account("vertex", "llmft-pipeline") or "")
    assert "service_account is empty" in (check_service_account("gke", "") or "")
    assert "not a Google service-account email" in (
        check_service_account("gke", "trainer@my-proj.iam.gserviceaccount.com") or ""
    )
    assert check_service_account("gke", "llmft-pipeline") is None
    assert check_dataflow_service_account("DataflowRunner", "") is None  # Compute Engine default
    assert (
        check_dataflow_service_account(
            "DataflowRunner", "123-compute@developer.gserviceaccount.com"
        )
        is None
    )
    assert "not a service-account email" in (
        check_dataflow_service_account("DataflowRunner", "x") or ""
    )


def test_unresolved_placeholders_and_pipeline_roots():
    assert "unresolved KFP placeholder" in (
        check_placeholder_resolved("run id", "{{$.pipeline_job_uuid}}") or ""
    )
    from components.run_identity import safe_run_id

    with pytest.raises(ValueError, match="unresolved KFP placeholder"):
        safe_run_id("{{$.pipeline_job_uuid}}")
    assert "gs:// pipeline root" in (check_pipeline_root("gke", "minio://mlpipeline") or "")
    assert check_pipeline_root("gke", "gs://b/root") is None
    assert check_pipeline_root("local", None) is None


def test_cloud_evaluation_runs_on_a_gpu():
    assert check_eval_accelerator("vertex", "NVIDIA_L4", 1) is None
    assert "not a Vertex accelerator" in (check_eval_accelerator("vertex", "L4", 1) or "")
    assert "at least 1 GPU" in (check_eval_accelerator("kfp", "", 0) or "")
    assert check_eval_accelerator("local", "", 0) is None
