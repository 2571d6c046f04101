"""The cost estimate against hand-computed cases, the budget, the job timeout it sets, the price
table and its overrides, and the actual cost from a job's own times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.preflight import cost, data_size, run_cost
from components.preflight.actual_cost import COST_FILE, actual_cost
from components.preflight.cost import RunShape
from components.preflight.model_size import ModelSize, flops_per_token, model_size
from components.preflight.prices import (
    GPU_HOUR_USD,
    PRICES_SOURCE,
    PRICES_WRITTEN,
    gpu_hour_price,
    load_prices,
)

pytestmark = pytest.mark.unit

# An 8B-class Llama: 7.5B parameters in matmuls, 32 layers, hidden 4096.
LLAMA8B = ModelSize(
    parameters=8_000_000_000, matmul_parameters=7_500_000_000, layers=32, hidden=4096
)
H100_RUN = RunShape(
    backend="vertex",
    nodes=2,
    gpus_per_node=8,
    accelerator_type="NVIDIA_H100_80GB",
    capacity="on-demand",
    max_steps=1000,
    global_batch_rows=64,
    seq_len=4096,
    eval_accelerator_type="NVIDIA_L4",
    eval_gpus=1,
)


def test_the_pinned_inputs_are_the_documented_ones() -> None:
    """The hand computations below use these; a change of them must change the cases too."""
    assert cost.MFU_MEASURED == {True: 0.528, False: 0.409}
    assert GPU_HOUR_USD["NVIDIA_H100_80GB"]["on-demand"] == 11.30
    assert GPU_HOUR_USD["NVIDIA_L4"]["on-demand"] == 1.00


def test_full_fine_tune_on_two_h100_nodes_by_hand() -> None:
    est = cost.estimate(H100_RUN, model=LLAMA8B)
    # tokens = 1000 steps x 64 rows x 4096 = 262,144,000
    assert est.train_tokens == 262_144_000 and est.gpus == 16
    # FLOPs/token = 6 x 7.5e9 + 12 x 32 x 4096 x 4096 = 51,442,450,944
    # tokens/s/GPU = 0.528 x 989.5e12 / 51,442,450,944 = 10,156.13
    assert est.tokens_per_s_per_gpu == pytest.approx(10_156.126, rel=1e-6)
    # compute = 262,144,000 / (10,156.13 x 16) = 1,613.21 s; one save at the end of
    # (8e9 x 4 + 8e9 x 8) bytes = 96 GB, the two nodes writing in parallel
    train_s = cost.STARTUP_S + 1_613.214 + 96 * cost.CHECKPOINT_S_PER_GB / 2
    train = est.step("train")
    assert train.hours == pytest.approx(train_s / 3600, rel=1e-5)
    assert train.gpu_hours == pytest.approx(16 * train_s / 3600, rel=1e-5)
    assert train.usd == pytest.approx(16 * train_s / 3600 * 11.30, rel=1e-5)
    # evaluate: 0.25 h on one L4 at $1.00; preprocess in the task: not priced
    assert est.step("evaluate").usd == pytest.approx(0.25)
    assert est.step("preprocess").usd == 0.0
    assert est.usd == pytest.approx(train.usd + 0.25)
    assert "train" in est.table() and "262,144,000 tokens" in est.table()


def test_lora_on_spot_with_time_checkpoints_by_hand() -> None:
    shape = RunShape(
        backend="gke",
        nodes=1,
        gpus_per_node=8,
        accelerator_type="nvidia-h100-80gb",  # the GKE name works too
        capacity="spot",
        max_steps=500,
        global_batch_rows=32,
        seq_len=2048,
        lora=True,
        compile=False,
        checkpoint_every_minutes=10,
    )
    est = cost.estimate(shape, model=ModelSize.of_count(1_000_000_000))
    # tokens = 500 x 32 x 2048 = 32,768,000; FLOPs/token = 4 x 1e9 (LoRA, no attention term known)
    # tokens/s/GPU = 0.409 x 989.5e12 / 4e9 = 101,176.375; compute = 32,768,000 / (8 x 101,176.375)
    # = 40.484 s: no 10-minute save falls in it, one at the end of 1e9 x 4 bytes = 4 GB
    assert est.tokens_per_s_per_gpu == pytest.approx(101_176.375)
    train_s = cost.STARTUP_S + 40.4838 + 4 * cost.CHECKPOINT_S_PER_GB
    assert est.step("train").hours == pytest.approx(train_s / 3600, rel=1e-5)
    assert est.step("train").usd == pytest.approx(8 * train_s / 3600 * 3.90, rel=1e-5)
    assert est.step("evaluate").usd == 0.0  # no eval GPU in this shape


def test_time_checkpoints_are_counted() -> None:
    shape = RunShape(
        **{**H100_RUN.__dict__, "checkpoint_every_minutes": 5.0, "checkpoint_every": 250}
    )
    est = cost.estimate(shape, model=LLAMA8B)
    # 1,614 s of compute: 5 saves by time (every 300 s), 4 by steps (every 250 of 1000), 1 at the end
    train_s = cost.STARTUP_S + 1_613.214 + 10 * 96 * cost.CHECKPOINT_S_PER_GB / 2
    assert est.step("train").hours == pytest.approx(train_s / 3600, rel=1e-5)


def test_dataflow_preprocess_by_hand() -> None:
    shape = RunShape(**{**H100_RUN.__dict__, "preprocess_runner": "DataflowRunner"})
    est = cost.estimate(shape, model=LLAMA8B, data_tokens=4_800_000)
    # 4.8M tokens / 480k per vCPU-s = 10 vCPU-s, + 300 s start: 310/3600 vCPU-h
    # x (0.056 + 3.75 x 0.003557) $/vCPU-h = 0.0059708
    assert est.step("preprocess").usd == pytest.approx(310 / 3600 * 0.06933875)
    assert est.data_tokens == 4_800_000
    assert "epochs" in est.table()


def test_bytes_to_tokens() -> None:
    assert data_size.tokens_from_bytes(2_860_000) == 1_000_000


def test_local_and_unknown_model_are_not_priced_and_refuse_a_budget() -> None:
    local = cost.estimate(RunShape(**{**H100_RUN.__dict__, "backend": "local"}), model=LLAMA8B)
    assert local.usd == 0.0 and local.step("train").hours is None
    assert cost.budget_error(local, 10.0) is None  # nothing to pay for
    unknown = cost.estimate(H100_RUN, model=None)
    assert "model_parameters" in (cost.budget_error(unknown, 10.0) or "")
    assert cost.budget_error(unknown, 0.0) is None  # no budget: no refusal


def test_budget_refuses_over_and_sets_the_timeout_under() -> None:
    est = cost.estimate(H100_RUN, model=LLAMA8B)
    error = cost.budget_error(est, est.usd - 1)
    assert error is not None and error.startswith(f"estimated cost ${est.usd:,.2f}")
    assert "\n" not in error and "max_cost_usd" in error
    assert cost.budget_error(est, est.usd + 1) is None
    # The timeout: what $1,000 leaves after the evaluate step's $0.25, at 16 x $11.30 an hour
    assert cost.budget_timeout_s(est, 1000.0) == int((1000 - 0.25) / (16 * 11.30) * 3600)
    assert cost.budget_timeout_s(est, 1000.0) > est.step("train").hours * 3600
    assert cost.budget_timeout_s(est, 0.0) == 0


def test_prices_override_by_parameter_and_file(tmp_path: Path) -> None:
    est = cost.estimate(H100_RUN, model=LLAMA8B, gpu_hour_price_usd=2.0)
    assert est.gpu_hour_usd == 2.0
    prices_file = tmp_path / "prices.yaml"
    prices_file.write_text("nvidia-h100-80gb: {on-demand: 7.5}\n")
    prices = load_prices(str(prices_file))
    assert prices["NVIDIA_H100_80GB"] == {"on-demand": 7.5, "spot": 3.90, "flex-start": 5.65}
    assert cost.estimate(H100_RUN, model=LLAMA8B, prices=prices).gpu_hour_usd == 7.5
    prices_file.write_text("NVIDIA_L4: {sometimes: 1}\n")
    with pytest.raises(ValueError, match="USD per GPU-hour"):
        load_prices(str(prices_file))
    with pytest.raises(ValueError, match="gpu_hour_price_usd"):
        gpu_hour_price("NVIDIA_L4", "monthly")


def test_every_accelerator_has_its_capacity_prices() -> None:
    """On-demand and Spot for every GPU; flex-start only where Vertex offers it (review P4)."""
    from components.platform.platform_facts import ACCELERATORS, vertex_flex_start

    for gpu in ACCELERATORS:
        prices = GPU_HOUR_USD[gpu.vertex_name]
        flex = vertex_flex_start(gpu.vertex_name)
        assert set(prices) == {"on-demand", "spot", *(["flex-start"] if flex else [])}, gpu
        assert prices["spot"] < prices.get("flex-start", prices["on-demand"]), gpu
        assert prices.get("flex-start", 0) < prices["on-demand"], gpu
    assert "NOT a published price" in PRICES_SOURCE
    assert "Compute Engine on-demand" in PRICES_SOURCE


def test_budget_timeout_uses_on_demand_unless_the_user_prices_it(tmp_path: Path) -> None:
    """Review P3: the table's Spot figure is a ratio, far below published Spot prices; the
    budget's deadline is computed at on-demand (the upper bound) unless a price is given."""
    spot_run = RunShape(**{**H100_RUN.__dict__, "capacity": "spot"})
    est = cost.estimate(spot_run, model=LLAMA8B)
    assert est.gpu_hour_usd == 3.90 and est.budget_gpu_hour_usd == 11.30
    assert cost.budget_timeout_s(est, 1000.0) == int((1000 - 0.25) / (16 * 11.30) * 3600)
    assert any("ratio of on-demand" in n for n in est.notes)
    own = cost.estimate(spot_run, model=LLAMA8B, gpu_hour_price_usd=6.57)
    assert cost.budget_timeout_s(own, 1000.0) == int((1000 - 0.25) / (16 * 6.57) * 3600)
    prices_file = tmp_path / "prices.yaml"
    prices_file.write_text("NVIDIA_H100_80GB: {spot: 6.0}\n")
    filed = cost.estimate(spot_run, model=LLAMA8B, prices=load_prices(str(prices_file)))
    assert filed.budget_gpu_hour_usd == 6.0
    assert cost.estimate(H100_RUN, model=LLAMA8B).budget_gpu_hour_usd == 11.30
    assert est.to_dict()["prices_written"] == PRICES_WRITTEN
    assert "prices_checked" not in est.to_dict() and "not checked online" in est.table()


def test_actual_cost_from_the_job_times() -> None:
    actual = actual_cost(
        started="2026-12-04T10:00:00+00:00",
        ended="2026-12-04T11:30:00+00:00",
        gpus=16,
        gpu_hour_usd=3.9,
        capacity="spot",
    )
    assert actual["hours"] == 1.5 and actual["gpu_hours"] == 24.0
    assert actual["cost_usd"] == pytest.approx(93.6)
    assert actual["queue_wait_s"] == 0


def test_time_queued_in_kueue_is_recorded_apart_and_not_billed() -> None:
    """A job suspended in a Kueue queue holds no GPU: 30 of its 90 minutes were queued."""
    from components.evaluation.outputs import cost_details

    actual = actual_cost(
        started="2026-12-04T10:00:00+00:00",
        ended="2026-12-04T11:30:00+00:00",
        gpus=16,
        gpu_hour_usd=3.9,
        capacity="spot",
        queued_s=1800,
    )
    assert actual["queue_wait_s"] == 1800 and actual["hours"] == 1.0
    assert actual["gpu_hours"] == 16.0 and actual["cost_usd"] == pytest.approx(62.4)
    assert cost_details(actual)["waiting in the Kueue queue"] == "1800 s (not billed)"


def test_model_size_is_read_from_config_json(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    size = model_size(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    total = sum(p.numel() for p in model.parameters())
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert size.parameters == total
    assert size.matmul_parameters == total - model.get_input_embeddings().weight.numel()
    assert (size.layers, size.hidden) == (config["num_hidden_layers"], config["hidden_size"])
    with pytest.raises(ValueError, match=r"cannot read the config\.json of .*missing"):
        model_size(str(tiny_model_dir / "missing"))


def test_train_step_records_the_actual_cost_and_the_report_shows_it(tmp_path: Path) -> None:
    """The train step turns the job's own times into cost.json (with the trainer's starts and
    preemptions); the evaluation report lists it."""
    from test_capacity_requests import request

    from components.evaluation.gate import GateDecision
    from components.evaluation.outputs import cost_details
    from components.evaluation.report import render_report
    from components.steps.train import record_actual_cost

    (tmp_path / "summary.json").write_text(json.dumps({"attempts": 3, "preemptions": 2}))
    times = {"started_at": "2026-12-04T10:00:00+00:00", "ended_at": "2026-12-04T12:15:00+00:00"}
    spot = request("vertex", capacity="spot")
    metadata = record_actual_cost(spot, times, str(tmp_path))
    # 2 nodes x 8 H100 for 2.25 h = 36 GPU-h at the Spot price of $3.90
    assert metadata == {"gpu_hours": 36.0, "cost_usd": 140.4}
    written = json.loads((tmp_path / COST_FILE).read_text())
    assert written["attempts"] == 3 and written["preemptions"] == 2
    assert written["started"] == times["started_at"] and written["capacity"] == "spot"

    details = cost_details(written)
    assert details["training cost"] == "$140.40 at $3.90/GPU-h, spot"
    assert details["training starts / preemptions"] == "3 / 2"
    page = render_report(
        metrics={},
        decision=GateDecision(passed=True),
        models={},
        samples=[],
        curves=None,
        details=details,
    )
    assert "training GPU-hours" in page and "36.00 (16 GPUs x 2.25 h)" in page


def test_the_jobs_own_start_and_end_are_read_from_each_backend() -> None:
    import datetime as dt

    from google.cloud import aiplatform_v1

    from components.launchers import gke, vertex

    start = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.UTC)
    job = aiplatform_v1.CustomJob(start_time=start, end_time=start + dt.timedelta(hours=2))
    assert vertex.job_times(job) == {
        "started_at": "2026-12-04T10:00:00+00:00",
        "ended_at": "2026-12-04T12:00:00+00:00",
    }
    assert vertex.job_times(aiplatform_v1.CustomJob()) == {}  # not started: the launcher's clock
    status = {"startTime": "2026-12-04T10:00:00Z", "completionTime": "2026-12-04T11:30:00Z"}
    assert gke.job_times({"status": status}) == {
        "started_at": "2026-12-04T10:00:00+00:00",
        "ended_at": "2026-12-04T11:30:00+00:00",
    }
    assert gke.job_times({"status": {"startTime": "2026-12-04T10:00:00Z"}}) == {
        "started_at": "2026-12-04T10:00:00+00:00"
    }
    # Kueue suspended it: v1.9 resets startTime on each resume, so the span starts at creation
    # and the launcher's queued_s is what is left out.
    queued = {
        "metadata": {"creationTimestamp": "2026-12-04T09:00:00Z"},
        "status": {**status, "conditions": [{"type": "Suspended", "status": "False"}]},
    }
    assert gke.job_times(queued)["started_at"] == "2026-12-04T09:00:00+00:00"
    from components.launchers.trainjob_api import trainjob_times

    trainjob = {
        "metadata": {"creationTimestamp": "2026-12-04T09:00:00Z"},
        "status": {"conditions": [{"type": "Complete", "status": "True",
                                   "lastTransitionTime": "2026-12-04T11:30:00Z"}]},
    }  # fmt: skip
    assert trainjob_times(trainjob) == {
        "started_at": "2026-12-04T09:00:00+00:00",
        "ended_at": "2026-12-04T11:30:00+00:00",
    }


def test_estimate_for_run_parameters_sizes_the_model_and_the_input(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """From `RunParams`: the model's size from its config.json, the data's tokens from the raw
    input's size, the batch from the trainer's config, Spot's time-based checkpoints."""
    from components.params.run_params import RunParams

    data = tmp_path / "train.jsonl"
    data.write_bytes(b"x" * 286_000)
    params = RunParams(
        backend="vertex",
        base_model=str(tiny_model_dir),
        train_data_uri=str(tmp_path / "*.jsonl"),
        preprocess_runner="DataflowRunner",
        capacity="spot",
        nodes=2,
        trainer_overrides={"micro_batch_size": 2, "grad_accum_steps": 3},
    )
    est = run_cost.estimate_for(params, remote=False)
    size = model_size(str(tiny_model_dir))
    shape = run_cost.shape_of(params)
    # 2 nodes x 8 processes (one per GPU) x 2 rows x 3 micro-batches = 96 rows per step
    assert shape.global_batch_rows == 96 and shape.checkpoint_every_minutes == 10.0
    assert est.train_tokens == 200 * 96 * 512
    assert est.data_tokens == 100_000  # 286,000 bytes / 2.86
    assert est.tokens_per_s_per_gpu == pytest.approx(
        0.528 * 989.5e12 / flops_per_token(size, 512, lora=False)
    )
    assert est.gpu_hour_usd == 3.90 and est.step("preprocess").usd > 0


def test_a_vertex_accelerator_missing_from_the_facts_is_estimated_as_unknown() -> None:
    """Review P5: NVIDIA_GB200 is a Vertex accelerator platform_facts lacks; the run is allowed,
    so the estimate says what it cannot know instead of refusing it."""
    shape = RunShape(**{**H100_RUN.__dict__, "accelerator_type": "NVIDIA_GB200"})
    unknown = cost.estimate(shape, model=LLAMA8B)
    (train,) = [s for s in unknown.steps if s.step == "train"]
    assert train.hours is None and unknown.gpu_hour_usd == 0.0
    assert any("NVIDIA_GB200 is not in" in n and "gpu_hour_price_usd" in n for n in unknown.notes)
    assert cost.estimate(shape, model=LLAMA8B, gpu_hour_price_usd=9.5).gpu_hour_usd == 9.5
