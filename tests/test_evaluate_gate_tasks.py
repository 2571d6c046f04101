"""Unit tests of issue 31's rules: the task-regression gate, the harness settings and results,
the memory-fit rule and machine suggestion, the run parameters' checks, the report's task table."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from components.evaluation import memory_fit
from components.evaluation.gate import GateThresholds, decide
from components.evaluation.harness import (
    HarnessSettings,
    flat_metrics,
    metric_label,
    parse_tasks,
    settings_errors,
    task_scores,
)
from components.params.run_checks import run_errors
from components.params.run_params import RunParams

LOSSES = {"base_eval_loss": 2.0, "tuned_eval_loss": 1.5}


def test_task_regression_gate_in_points() -> None:
    metrics = {
        **LOSSES,
        "base_task_mmlu": 0.500, "tuned_task_mmlu": 0.485,  # -1.5 points
        "base_task_gsm8k": 0.300, "tuned_task_gsm8k": 0.320,  # +2.0 points
    }  # fmt: skip
    strict = decide(metrics, GateThresholds(max_task_regression=1.0))
    assert not strict.passed
    assert [c["name"] for c in strict.checks if not c["passed"]] == ["task_regression:mmlu"]
    assert "50.0 -> 48.5 (-1.5 points); allowed drop <= 1.0" in strict.failures[0]
    assert decide(metrics, GateThresholds(max_task_regression=2.0)).passed
    # 100 (the default) reports without gating: no task check at all.
    assert [c["name"] for c in decide(metrics, GateThresholds()).checks] == ["loss_improvement"]


def test_task_gate_without_tasks_fails_rather_than_passing() -> None:
    decision = decide(LOSSES, GateThresholds(max_task_regression=5.0))
    assert not decision.passed
    assert "no harness task was evaluated" in decision.failures[0]


def test_gate_threshold_ranges() -> None:
    with pytest.raises(ValueError, match=r"max_task_regression must be in \[0, 100\]"):
        GateThresholds(max_task_regression=-1).validate()
    with pytest.raises(ValueError, match=r"judge_min_win_rate must be in \[0, 1\]"):
        GateThresholds(judge_min_win_rate=2).validate()


def test_parse_tasks_and_settings() -> None:
    assert parse_tasks("") == ()
    assert parse_tasks(" mmlu, arc_easy,,mmlu ,") == ("mmlu", "arc_easy")
    errors = settings_errors(HarnessSettings(tasks=("x",), num_fewshot=-2, limit=0, batch_size=0))
    assert len(errors) == 3


def test_task_scores_keep_metrics_in_harness_order_and_drop_stderr() -> None:
    output = {
        "results": {
            "gsm8k": {
                "alias": "gsm8k", "exact_match,strict-match": 0.25,
                "exact_match_stderr,strict-match": 0.01, "exact_match,flexible-extract": 0.5,
                "exact_match_stderr,flexible-extract": "N/A", "sample_len": 8,
            },
            "mmlu_anatomy": {"acc,none": 0.9},
        },
        "higher_is_better": {"gsm8k": {"exact_match": True}, "mmlu_anatomy": {"acc": True}},
    }  # fmt: skip
    scores = task_scores(output, ("gsm8k",))
    assert scores == {
        "gsm8k": {
            "primary": "exact_match,strict-match",
            "metrics": {"exact_match,strict-match": 0.25, "exact_match,flexible-extract": 0.5},
        }
    }
    assert flat_metrics("tuned", scores) == {"tuned_task_gsm8k": 0.25}
    assert metric_label("acc,none") == "acc"
    assert metric_label("exact_match,strict-match") == "exact_match (strict-match)"


def test_headline_metric_is_the_first_higher_is_better_one() -> None:
    """lambada_openai reports perplexity (lower is better) before acc: gating on perplexity in
    points would call a worse model an improvement."""
    output = {
        "results": {
            "lambada_openai": {"alias": "lambada_openai", "perplexity,none": 25.0,
                               "perplexity_stderr,none": 1.0, "acc,none": 0.4},
            "wikitext": {"word_perplexity,none": 30.0, "bits_per_byte,none": 0.9},
        },
        "higher_is_better": {
            "lambada_openai": {"perplexity": False, "acc": True},
            "wikitext": {"word_perplexity": False, "bits_per_byte": False},
        },
    }  # fmt: skip
    scores = task_scores(output, ("lambada_openai",))
    assert scores["lambada_openai"]["primary"] == "acc,none"
    assert flat_metrics("base", scores) == {"base_task_lambada_openai": 0.4}
    with pytest.raises(ValueError, match="'wikitext' reports no higher-is-better metric"):
        task_scores(output, ("wikitext",))


def test_a_task_without_results_is_an_error_naming_it() -> None:
    output = {"results": {"llmft_facts_mc": {"acc,none": 0.5}}, "higher_is_better": {}}
    with pytest.raises(ValueError, match="no metric for eval task 'rvtag'"):
        task_scores(output, ("rvtag",))


def test_tags_and_groups_without_a_score_are_refused_before_any_model(tmp_path: Path) -> None:
    """A tag, or a group without aggregate_metric_list, runs its tasks but reports no score of
    its own: refused up front with its tasks listed; a group with an aggregate is accepted."""
    from lm_eval.tasks import TaskManager

    from components.evaluation.harness import PROJECT_TASKS_DIR, check_tasks

    mc = (PROJECT_TASKS_DIR / "llmft_facts_mc.yaml").read_text()
    for name in ("one", "two"):
        text = mc.replace("task: llmft_facts_mc", f"task: facts_{name}\ntag: facts_tag")
        (tmp_path / f"facts_{name}.yaml").write_text(text)
    for py in PROJECT_TASKS_DIR.glob("*.py"):
        (tmp_path / py.name).write_text(py.read_text())
    (tmp_path / "llmft_facts.jsonl").write_text(
        (PROJECT_TASKS_DIR / "llmft_facts.jsonl").read_text()
    )
    (tmp_path / "plain_group.yaml").write_text("group: plain_group\ntask: [facts_one, facts_two]\n")
    (tmp_path / "scored_group.yaml").write_text(
        "group: scored_group\ntask: [facts_one, facts_two]\naggregate_metric_list:\n"
        "  - metric: acc\n    aggregation: mean\n"
    )
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    assert check_tasks(("facts_one", "scored_group"), manager) is manager
    with pytest.raises(ValueError) as refused:
        check_tasks(("facts_one", "facts_tag", "plain_group"), manager)
    message = str(refused.value)
    assert "facts_tag is a tag: list its tasks (facts_one, facts_two)" in message
    assert "plain_group is a group without an aggregate score" in message
    assert "(facts_one, facts_two)" in message.split("plain_group")[1]


def test_run_parameters_check_the_task_gate() -> None:
    common = {"train_data_uri": "d.jsonl", "base_model": "m"}
    errors = run_errors(RunParams(**common, max_task_regression=2.0))
    assert any("eval_tasks is empty" in e for e in errors), errors
    assert not any("eval_tasks" in e for e in run_errors(RunParams(**common, eval_tasks="mmlu")))
    errors = run_errors(RunParams(**common, eval_num_fewshot=-2, eval_limit=-1))
    assert any("eval_num_fewshot" in e for e in errors) and any("eval_limit" in e for e in errors)


def test_memory_rule_and_smallest_fitting_machine() -> None:
    # 7B in bf16 with 20% headroom: 15.6 GiB; one L4 (24 GiB, 21.6 usable) holds it.
    assert memory_fit.required_gib(7_000_000_000) == pytest.approx(15.646, abs=1e-3)
    l4 = memory_fit.Machine("NVIDIA_L4", 1, 24.0)
    assert memory_fit.fit_error("7B", 7_000_000_000, machine=l4) is None
    # 70B: 156 GiB. 4 x A100 40GB (144 GiB usable) is too small; 8 x L4 (192 GiB, 172.8
    # usable) is the least total memory that holds it.
    error = memory_fit.fit_error("base model 'llama-70b'", 70_000_000_000, machine=l4)
    assert error is not None
    assert "70.00B parameters and needs about 156 GiB" in error
    assert "more than 1 x NVIDIA_L4 (24 GiB, 22 GiB usable)" in error
    assert error.endswith("use eval_accelerator_type=NVIDIA_L4, eval_accelerator_count=8")
    best = memory_fit.smallest_fitting(memory_fit.required_gib(70_000_000_000))
    assert best == memory_fit.Machine("NVIDIA_L4", 8, 24.0)
    # 600B (1341 GiB) fits on no single machine (8 x H200: 1015 GiB usable).
    assert "no single evaluation machine" in (
        memory_fit.fit_error("m", 600_000_000_000, machine=l4) or ""
    )


def _fake_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A safetensors file whose header declares `shapes` (no tensor data: only headers are read)."""
    header = {
        name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}
        for name, shape in shapes.items()
    }
    header["__metadata__"] = {"format": "pt"}  # type: ignore[assignment]
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_parameter_count_reads_only_headers(tmp_path: Path) -> None:
    model = tmp_path / "llama-70b"
    model.mkdir()
    (model / "config.json").write_text("{}")
    _fake_safetensors(model / "model-00001-of-00002.safetensors", {"a": [8192, 28672], "b": [8192]})
    _fake_safetensors(model / "model-00002-of-00002.safetensors", {"c": [69_000_000_000]})
    count = memory_fit.parameter_count(str(model))
    assert count == 8192 * 28672 + 8192 + 69_000_000_000
    assert memory_fit.parameter_count(str(tmp_path / "missing")) is None
    assert memory_fit.parameter_count("org/hub-model") is None
    error = memory_fit.eval_machine_error(str(model), "NVIDIA_L4", 1)
    assert error and "eval_accelerator_count=8" in error
    assert memory_fit.eval_machine_error(str(model), "NVIDIA_H200_141GB", 2) is None
    assert "is unknown" in (memory_fit.eval_machine_error(str(model), "TPU_V9", 1) or "")


def test_validation_refuses_a_model_too_big_for_the_eval_machine(tmp_path: Path) -> None:
    """`llmft run`'s check (components/preflight/validation.py): before training, on the user's machine."""
    from components.preflight.validation import check_run_parameters

    model = tmp_path / "big"
    model.mkdir()
    _fake_safetensors(model / "model.safetensors", {"w": [70_000_000_000]})
    values = {
        "train_data_uri": "gs://b/train.jsonl", "base_model": str(model), "backend": "vertex",
        "project": "my-project-1", "work_uri": "gs://b/w", "eval_accelerator_type": "NVIDIA_L4",
        "eval_accelerator_count": 1,
    }  # fmt: skip
    with pytest.raises(
        ValueError, match=r"eval_accelerator_type=NVIDIA_L4, eval_accelerator_count=8"
    ):
        check_run_parameters(values)
    check_run_parameters(
        {**values, "eval_accelerator_type": "NVIDIA_H200_141GB", "eval_accelerator_count": 2}
    )


def test_report_shows_a_task_table() -> None:
    from components.evaluation.gate import GateDecision
    from components.evaluation.report import render_report

    tasks = {
        "arc_easy": {
            "primary": "acc,none", "metrics": ["acc,none", "acc_norm,none"],
            "labels": {"acc,none": "acc", "acc_norm,none": "acc_norm"},
            "scores": {"base": {"acc,none": 0.5, "acc_norm,none": 0.4},
                       "tuned": {"acc,none": 0.55, "acc_norm,none": 0.35}},
        }
    }  # fmt: skip
    page = render_report(
        metrics=LOSSES, decision=GateDecision(True), models={"base": "b", "tuned": "t"},
        samples=[], curves=None, tasks=tasks,
    )  # fmt: skip
    assert '<table id="tasks">' in page
    assert "<td>arc_easy</td><td>acc</td><td>50.0</td><td>55.0</td>" in page
    assert '<td class="better">+5.0</td>' in page and '<td class="worse">-5.0</td>' in page
