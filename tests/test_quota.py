"""Quota before money (cloud audit 2026-12-07, C1): what a run needs, read against a fresh
project's granted quota through the Cloud Quotas API fake (tests/fakes/cloud_quotas.py, answers
from the reviewed tests/golden/cloud_quotas_fresh_project.json), refused before anything starts
by `llmft run` and the validate step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes.cloud_quotas import GOLDEN, FakeCloudQuotas
from typer.testing import CliRunner

from components.params.param_values import params_from_mapping
from components.params.run_params import RunParams
from components.params.step_params import request_of
from components.preflight import quota
from pipelines.cli import app

REPO = Path(__file__).resolve().parents[1]
VERTEX = "aiplatform.googleapis.com"
COMPUTE = "compute.googleapis.com"


H100_SHAPE: dict[str, Any] = {
    "nodes": 2,
    "machine_type": "a3-highgpu-8g",
    "accelerator_type": "NVIDIA_H100_80GB",
    "accelerator_count": 8,
    "quantize_base": "none",
    "trainer_overrides": {},
}
"""The big shape (the cloud defaults before issue 46; docs/deploy/README.md "The run's shape"),
which most tests here size against a fresh project's quota."""


def run_params(target: str, *, first_run: bool = False, **changes: Any) -> RunParams:
    """A run on the big H100 shape, or with `first_run` on the cloud targets' own defaults."""
    shape = {} if first_run else H100_SHAPE
    values = {"project": "my-project", "region": "us-central1", **shape, **changes}
    return params_from_mapping(values, base=RunParams.for_target(target))


def test_a_console_default_run_fits_what_a_fresh_project_has() -> None:
    """Issue 46: the cloud targets' defaults (target_defaults.FIRST_RUN_SHAPE) ask for 2 L4 (training;
    evaluation's one L4 runs after it), which the fresh project's quota holds, on Vertex and on
    GKE."""
    default = run_params("vertex", first_run=True)
    needs = {(n.metric, n.amount) for n in quota.needs_for(default)}
    assert needs == {(f"{VERTEX}/custom_model_training_nvidia_l4_gpus", 2), (f"{COMPUTE}/cpus", 1)}
    report = quota.quota_check(default, session=FakeCloudQuotas().session())
    assert (report.errors, report.warnings) == ([], [])
    gke = run_params(
        "kfp", first_run=True,
        gke_cluster="projects/my-project/locations/us-central1-a/clusters/llmft",
    )  # fmt: skip
    report = quota.quota_check(gke, session=FakeCloudQuotas().session())
    assert (report.errors, report.warnings) == ([], [])


@pytest.mark.unit
def test_the_guide_states_the_fit_checks_estimate_for_the_default_shape() -> None:
    """docs/deploy/README.md ("The run's shape") and FIRST_RUN_SHAPE's docstring quote the fit
    check's estimate of Qwen/Qwen2.5-7B-Instruct on the default 2 L4: it must be the estimate the
    check computes (its shape from the model's config.json: 28 layers, hidden 3584, intermediate
    18944, 4 KV heads of 128, vocab 152064, 7.62B parameters)."""
    import re

    from components.platform.platform_facts import accelerator
    from components.preflight.train_fit import GIB, fit_of, plan_of
    from trainer.memory_model import ModelShape

    qwen = ModelShape(7_615_616_512, 28, 3584, 18944, 152064, kv_hidden=512)
    default = run_params("vertex", first_run=True)
    fit = fit_of(qwen, plan_of(default), accelerator("NVIDIA_L4").memory_gib * GIB)
    assert fit.comfortable
    guide = (REPO / "docs" / "deploy" / "README.md").read_text()
    source = (REPO / "components" / "params" / "target_defaults.py").read_text()
    for text in (guide, source):
        stated = re.search(r"~(\d+) GiB\s+of\s+(?:each|an)\s+L4", text)
        assert stated and int(stated.group(1)) == round(fit.estimate.total / GIB)


def test_a_big_vertex_run_needs_16_on_demand_h100_an_l4_and_a_dataflow_worker() -> None:
    needs = {(n.metric, n.region, n.amount, n.hard) for n in quota.needs_for(run_params("vertex"))}
    assert needs == {
        (f"{VERTEX}/custom_model_training_nvidia_h100_gpus", "us-central1", 16, True),
        (f"{VERTEX}/custom_model_training_nvidia_l4_gpus", "us-central1", 1, True),
        (f"{COMPUTE}/cpus", "us-central1", 1, True),
    }


def test_capacity_picks_the_preemptible_quota_and_a_reservation_none() -> None:
    spot = quota.needs_for(run_params("vertex", capacity="spot"))
    assert f"{VERTEX}/custom_model_training_preemptible_nvidia_h100_gpus" in {
        n.metric for n in spot
    }
    reserved = quota.needs_for(
        run_params("vertex", reservation="projects/p/zones/z/reservations/r")
    )
    assert not [n for n in reserved if "h100" in n.metric]


def test_a_local_run_needs_no_quota() -> None:
    assert quota.needs_for(run_params("local")) == []


def test_a_fresh_project_refuses_the_big_vertex_run_with_one_line(golden: Any) -> None:
    fake = FakeCloudQuotas()
    report = quota.quota_check(run_params("vertex"), session=fake.session())
    (error,) = report.errors
    assert error.startswith(
        f"quota {VERTEX}/custom_model_training_nvidia_h100_gpus "
        "(CustomModelTrainingNvidiaH100GpusPerProjectPerRegion) in us-central1 is 0, the run "
        "needs 16 (training: 2 nodes x 8 NVIDIA_H100_80GB): ask for more at "
        "https://console.cloud.google.com/iam-admin/quotas?project=my-project"
    )
    assert report.warnings == []
    golden.check("cloud_quotas_requests.json", fake.requests)


def test_spot_h100_and_l4_fit_what_the_fresh_project_has() -> None:
    fake = FakeCloudQuotas()
    assert (
        quota.quota_check(run_params("vertex", capacity="spot"), session=fake.session()).errors
        == []
    )
    l4 = run_params(
        "kfp", gke_cluster="projects/my-project/locations/us-central1-a/clusters/llmft",
        machine_type="g2-standard-24", accelerator_type="NVIDIA_L4", accelerator_count=2,
    )  # fmt: skip
    report = quota.quota_check(l4, session=fake.session())
    assert (report.errors, report.warnings) == ([], [])


def test_gke_h100_counts_against_the_gpu_family_quota_in_the_clusters_region() -> None:
    params = run_params(
        "kfp", gke_cluster="projects/my-project/locations/us-central1-c/clusters/llmft"
    )
    report = quota.quota_check(params, session=FakeCloudQuotas().session())
    family, all_regions = report.errors
    assert f"{COMPUTE}/nvidia_h100_gpus (GPUS-PER-GPU-FAMILY-per-project-region)" in family
    assert "in us-central1 is 0, the run needs 16" in family
    assert (
        f"{COMPUTE}/gpus_all_regions (GPUS-ALL-REGIONS-per-project) in global is 4" in all_regions
    )


def test_gke_gpus_are_also_bounded_by_the_project_wide_gpu_quota() -> None:
    """Review Q1: a regional grant is not enough where GPUS_ALL_REGIONS is 0 (a fresh project's
    usual value); the autoscaler could not add the nodes."""
    pages = json.loads(GOLDEN.read_text())
    for page in pages[COMPUTE]:
        for info in page["quotaInfos"]:
            if info["quotaId"] == "GPUS-ALL-REGIONS-per-project":
                info["dimensionsInfos"][0]["details"]["value"] = "0"
    l4 = run_params(
        "kfp", gke_cluster="projects/my-project/locations/us-central1-a/clusters/llmft",
        machine_type="g2-standard-24", accelerator_type="NVIDIA_L4", accelerator_count=2,
    )  # fmt: skip
    report = quota.quota_check(l4, session=FakeCloudQuotas(pages).session())
    (error,) = report.errors
    assert error.startswith(
        f"quota {COMPUTE}/gpus_all_regions (GPUS-ALL-REGIONS-per-project) in global is 0, the run "
        "needs 4 (training: 2 nodes x 2 NVIDIA_L4)"
    )


def test_a_gke_run_larger_than_its_gpu_pool_is_refused() -> None:
    """Review Q3: 4 nodes against a pool that grows to 2 per zone (tests/golden/
    gke_node_pools.json) would wait for nodes the autoscaler may not add."""
    cluster = "projects/my-project/locations/us-central1-a/clusters/llmft"
    params = run_params("kfp", gke_cluster=cluster, capacity="spot", nodes=4)
    fake = FakeCloudQuotas()
    report = quota.quota_check(params, session=fake.session())
    assert report.errors[-1:] == [
        f"node pool: the a3-highgpu-8g pools of {cluster} grow to at most 2 nodes in a zone, the "
        "run needs 4: raise the pool's maximum (infra setting gke.gpu_max_nodes) or pass "
        "--param nodes=2"
    ]
    assert fake.pool_router.requests[0].path == f"/v1/{cluster}/nodePools"
    two = run_params("kfp", gke_cluster=cluster, capacity="spot", nodes=2)
    assert quota.pool_check(two, FakeCloudQuotas().session()).errors == []
    other = run_params("kfp", gke_cluster=cluster, capacity="spot", machine_type="a3-megagpu-8g")
    (warning,) = quota.pool_check(other, FakeCloudQuotas().session()).warnings
    assert "has no a3-megagpu-8g pool" in warning
    (denied,) = quota.pool_check(two, FakeCloudQuotas().deny().session()).warnings
    assert "HTTP 403" in denied and "roles/container.clusterViewer" in denied


def test_a_pools_size_is_its_per_zone_autoscaling_maximum() -> None:
    assert quota.pool_max_nodes({"autoscaling": {"enabled": True, "maxNodeCount": 3}}) == 3
    assert quota.pool_max_nodes({"autoscaling": {"enabled": True, "totalMaxNodeCount": 5}}) == 5
    assert quota.pool_max_nodes({"initialNodeCount": 2, "locations": ["a", "b"]}) == 2


def test_more_dataflow_workers_than_the_cpu_quota_is_a_warning() -> None:
    params = run_params(
        "vertex", capacity="spot", dataflow_options={"max_num_workers": 10, "machine_type": "n2-standard-8"}
    )  # fmt: skip
    report = quota.quota_check(params, session=FakeCloudQuotas().session())
    assert report.errors == []
    (warning,) = report.warnings
    assert "compute.googleapis.com/cpus" in warning and "is 24, the run needs 80" in warning


def test_unreadable_quota_is_a_warning_naming_the_role() -> None:
    report = quota.quota_check(run_params("vertex"), session=FakeCloudQuotas().deny().session())
    assert report.errors == []
    assert report.warnings and all("roles/cloudquotas.viewer" in w for w in report.warnings)


def test_user_credentials_without_a_quota_project_get_the_gcloud_fix() -> None:
    """Review Q4: a 403 for a missing quota project names the command that sets one, not a role."""
    fake = FakeCloudQuotas().deny()
    fake.router.routes.clear()
    message = (
        "Your application is authenticating by using local Application Default Credentials. The "
        "cloudquotas.googleapis.com API requires a quota project, which is not set by default."
    )
    fake.router.on("GET", r"/v1/.*", (403, {"error": {"code": 403, "message": message}}))
    report = quota.quota_check(run_params("vertex"), session=fake.session())
    assert report.errors == []
    assert report.warnings and all(
        "gcloud auth application-default set-quota-project my-project" in w
        and "roles/cloudquotas.viewer" not in w
        for w in report.warnings
    )


def test_no_credentials_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    def none() -> Any:
        raise quota.QuotaUnreadable("no Google Cloud credentials (test)")

    monkeypatch.setattr(quota, "SESSION_FACTORY", none)
    report = quota.quota_check(run_params("vertex"))
    assert report.errors == [] and "no Google Cloud credentials" in report.warnings[0]


@pytest.fixture
def fake_quotas(monkeypatch: pytest.MonkeyPatch) -> FakeCloudQuotas:
    fake = FakeCloudQuotas()
    monkeypatch.setattr(quota, "SESSION_FACTORY", fake.session)
    monkeypatch.chdir(REPO)
    return fake


def _run(*extra: str) -> Any:
    return CliRunner().invoke(
        app,
        [
            "run", "--backend", "vertex", "--config", "docs/deploy/example.yaml", "--dry-run",
            "--project", "my-project", "--pipeline-root", "gs://my-bucket/pipeline-root",
            "--schedule-time", "2026-01-05T03:00:00Z", "--param", "base_model=org/model", *extra,
        ],
    )  # fmt: skip


BIG = [x for k, v in H100_SHAPE.items() for x in ("--param", f"{k}={json.dumps(v)}")]
"""H100_SHAPE as `llmft run` flags (strings as JSON too: the values' own coercion reads them)."""


def test_llmft_run_refuses_before_anything_starts(fake_quotas: FakeCloudQuotas) -> None:
    result = _run(*BIG)
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert "custom_model_training_nvidia_h100_gpus" in line and "is 0, the run needs 16" in line
    assert "dry run:" not in result.output


def test_llmft_run_passes_one_parameter_away(fake_quotas: FakeCloudQuotas) -> None:
    result = _run(*BIG, "--param", "capacity=spot")
    assert result.exit_code == 0, result.output
    assert _run().exit_code == 0  # the example config on the first-run shape


def test_the_validate_step_checks_quota_for_a_console_run(
    fake_quotas: FakeCloudQuotas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's own quota check, after its other checks (their inputs faked as passing)."""
    from components.steps import validate

    monkeypatch.setattr(validate, "data_errors", lambda *a, **k: [])
    monkeypatch.setattr(validate, "evaluation_errors", lambda *a, **k: [])
    monkeypatch.setattr(validate, "fit_errors", lambda *a, **k: [])
    monkeypatch.setattr(validate, "load_hf_token", lambda **k: None)
    request = request_of(
        validate.COMPONENT,
        **{**run_params("vertex").as_dict(), "train_data_uri": "gs://b/d.jsonl",
           "base_model": "gs://b/model", "work_uri": "gs://b/work",
           "dataflow_service_account": "llmft-dataflow@my-project.iam.gserviceaccount.com"},
        target="vertex", run_id="run-1",
    )  # fmt: skip
    monkeypatch.setattr(validate.run_cost, "estimate_for", _FakeEstimate)
    with pytest.raises(ValueError, match="is 0, the run needs 16"):
        validate.run(request)


class _FakeEstimate:
    """The cost estimate stands in (it reads the model's config.json, not under test here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def table(self) -> str:
        return "(estimate)"

    def to_dict(self) -> dict[str, Any]:
        return {}
