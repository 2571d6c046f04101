"""objective=grpo's run parameters: each mistake the issue lists is one `error:` line and exit 2
from `llmft run`, before anything is written; a good GRPO run's parameters pass, and the rewards
and the trainer settings (trainer_overrides, like DPO's beta) reach the trainer's config."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from components.params.run_checks import run_errors
from components.params.run_params import RunParams
from components.params.trainer_params import planned_trainer_config
from pipelines.cli import app
from trainer.grpo.tasks import ARITHMETIC_REWARDS


def llmft(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def grpo_run(tmp_path: Path, *params: str) -> Any:
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    values = ("objective=grpo", f"train_data_uri={data}", f"workdir={tmp_path / 'run'}", *params)
    return llmft("run", *(a for v in values for a in ("--param", v)))


@pytest.mark.parametrize(
    ("params", "says"),
    [
        (("data_kind=instruction", f"rewards={ARITHMETIC_REWARDS}"), "set data_kind=prompts"),
        (("data_kind=prompts",), "objective=grpo needs a reward"),
        (
            ("data_kind=prompts", f"rewards={ARITHMETIC_REWARDS}",
             'trainer_overrides={"grpo_group_size": 1}'),
            "grpo_group_size must be >= 2",
        ),
        (("data_kind=prompts", "reward_module=/nonexistent/reward.py"), "does not exist"),
        (("data_kind=prompts", "rewards=[{\"name\": \"exact\"}]"), "unknown reward 'exact'"),
    ],
)  # fmt: skip
def test_each_grpo_mistake_is_one_error_line_before_anything_starts(
    tmp_path: Path, params: tuple[str, ...], says: str
) -> None:
    result = grpo_run(tmp_path, *params)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "Traceback" not in result.output
    problems = [line for line in result.output.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and says in problems[0], result.output
    assert not (tmp_path / "run").exists()


def test_a_reward_module_without_its_function_is_refused_unrun(tmp_path: Path) -> None:
    module = tmp_path / "reward.py"
    module.write_text("raise SystemExit('never run by the checks')\ndef other(c, p): return []\n")
    result = grpo_run(tmp_path, "data_kind=prompts", f"reward_module={module}")
    assert result.exit_code == 2 and "does not define reward(" in result.output, result.output
    assert not (tmp_path / "run").exists()


def test_grpo_parameters_pass_and_reach_the_trainer(tmp_path: Path) -> None:
    module = tmp_path / "reward.py"
    module.write_text("def score(completions, prompts, **columns):\n    return [0.0]\n")
    params = RunParams(
        train_data_uri="p.jsonl", base_model="m", objective="grpo", data_kind="prompts",
        rewards=ARITHMETIC_REWARDS, reward_module=f"{module}:score",
        trainer_overrides={"lora_rank": 8, "grpo_group_size": 8, "grpo_beta": 0.04,
                           "grpo_loss_type": "dr_grpo"},
    )  # fmt: skip
    assert run_errors(params) == []
    config = planned_trainer_config(params)
    assert config.objective == "grpo" and config.rewards == ARITHMETIC_REWARDS
    assert config.reward_module == f"{module}:score" and config.grpo_group_size == 8
    assert config.grpo_loss_type == "dr_grpo" and config.grpo_beta == 0.04
    # The run parameters, not trainer_overrides, carry the rewards.
    moved = RunParams(
        train_data_uri="p.jsonl", base_model="m", objective="grpo", data_kind="prompts",
        rewards=ARITHMETIC_REWARDS, trainer_overrides={"rewards": "[]"},
    )  # fmt: skip
    assert any("set the run parameter rewards" in e for e in run_errors(moved))
    # Prompt records train only with grpo; a cloud job reads a reward module from gs:// only.
    sft = RunParams(train_data_uri="p.jsonl", base_model="m", data_kind="prompts")
    assert any("set objective=grpo" in e for e in run_errors(sft))
    cloud = RunParams(
        train_data_uri="p.jsonl", base_model="m", objective="grpo", data_kind="prompts",
        reward_module=str(module), backend="vertex",
    )  # fmt: skip
    assert any("reads it from gs://" in e for e in run_errors(cloud))


def test_the_cost_estimate_counts_the_rollouts_and_their_tokens() -> None:
    """objective=grpo: rows are prompts, each G completions of up to seq_len + max completion
    tokens trained on, and generating time is added (decoding bound by memory bandwidth); the
    note says how the job splits between generating and training."""
    from components.preflight import cost, run_cost

    def run(**overrides: Any) -> RunParams:
        return RunParams(
            backend="vertex", base_model="m", train_data_uri="p.jsonl", objective="grpo",
            data_kind="prompts", rewards=ARITHMETIC_REWARDS, model_parameters=1_000_000_000,
            seq_len=256, max_steps=100, accelerator_type="NVIDIA_H100_80GB",
            accelerator_count=1, nodes=1, trainer_overrides={"micro_batch_size": 2, **overrides},
        )  # fmt: skip

    params = run(grpo_group_size=8, grpo_max_completion_tokens=512)
    est = run_cost.estimate_for(params, remote=False)
    assert est.train_tokens == 100 * 2 * 8 * (256 + 512)  # 2 prompts a step, 8 completions each
    (note,) = [n for n in est.notes if n.startswith("objective=grpo")]
    assert "generating" in note and "16 sequences x 512 tokens" in note
    shape = run_cost.shape_of(params)
    from components.preflight.model_size import ModelSize

    size = ModelSize.of_count(1_000_000_000)
    # 512 decoding steps, each reading 2 GB of bf16 weights at half of 3.35 TB/s, plus overhead
    per_token = 2e9 / (3.35e12 * 0.5) + 0.02
    assert cost.rollout_seconds(shape, size) == pytest.approx(
        512 * per_token + 2 * 1e9 * 16 * 256 / (989.5e12 * 0.409), rel=1e-6
    )
    shorter = run_cost.estimate_for(
        run(grpo_group_size=8, grpo_max_completion_tokens=64), remote=False
    )
    assert shorter.step("train").hours < est.step("train").hours
    # Two optimizer steps per rollout (grpo_num_iterations): half the rollouts, the same training.
    reused = run_cost.estimate_for(
        run(grpo_group_size=8, grpo_max_completion_tokens=512, grpo_num_iterations=2),
        remote=False,
    )
    hours = est.step("train").hours - reused.step("train").hours
    assert hours * 3600 == pytest.approx(50 * cost.rollout_seconds(shape, size), rel=1e-6)


def test_the_fit_check_holds_a_rollouts_kv_cache() -> None:
    """The rollout's KV cache (micro_batch_size x G sequences) is what must fit besides the
    training step: many long completions of an 8B model do not fit an L4 even with LoRA."""
    from components.preflight.train_fit import Plan, fit_of
    from trainer.config import TrainConfig
    from trainer.memory_model import LLAMA3_8B, kv_cache_bytes

    config = TrainConfig(
        model="m", data="d", output="o", objective="grpo", rewards=ARITHMETIC_REWARDS,
        lora_rank=16, quantize_base="nf4", micro_batch_size=1, grpo_group_size=16,
        grpo_max_completion_tokens=4096, activation_checkpointing=True,
    )  # fmt: skip
    gpu = 80 * 2**30
    fit = fit_of(LLAMA3_8B, Plan(config, world_size=1, seq_len=512), gpu)
    cache = kv_cache_bytes(LLAMA3_8B, 16, 512 + 4096)
    assert fit.rollout_floor >= cache > 0 and fit.lower_bound >= fit.rollout_floor
    small = Plan(
        dataclasses.replace(config, grpo_group_size=2, grpo_max_completion_tokens=128),
        world_size=1,
        seq_len=512,
    )
    assert fit_of(LLAMA3_8B, small, gpu).rollout_floor < fit.rollout_floor
    sft = Plan(dataclasses.replace(config, objective="sft"), world_size=1, seq_len=512)
    assert fit_of(LLAMA3_8B, sft, gpu).rollout_floor == 0.0


def test_llmft_evaluate_takes_the_rewards_of_a_grpo_model(tmp_path: Path) -> None:
    """`llmft evaluate --objective grpo` needs the run's rewards: without them, exit 2 and one
    `error:` line before anything loads."""
    result = llmft(
        "evaluate", "--base", str(tmp_path), "--tuned", str(tmp_path), "--data", str(tmp_path),
        "--output", str(tmp_path / "eval"), "--objective", "grpo",
    )  # fmt: skip
    assert result.exit_code == 2 and result.output.startswith("error: "), result.output
    assert "objective=grpo is evaluated by its rewards" in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1


@pytest.mark.unit
def test_iterations_qlora_and_vllm_settings_reach_the_trainer_or_are_refused() -> None:
    from trainer.config import TrainConfig

    def errors(**overrides: Any) -> list[str]:
        base = {"model": "m", "data": "d", "output": "o", "objective": "grpo",
                "rewards": ARITHMETIC_REWARDS, "lora_rank": 8}  # fmt: skip
        return TrainConfig(**{**base, **overrides}).errors()

    assert errors(quantize_base="nf4", grpo_beta=0.04, grpo_num_iterations=2) == []  # QLoRA
    assert errors(grpo_use_vllm=True, grpo_vllm_enable_sleep_mode=True) == []
    refused = {
        "grpo_num_iterations must be >= 1": {"grpo_num_iterations": 0},
        "grpo_vllm_gpu_memory_utilization must be in (0, 1)": {
            "grpo_vllm_gpu_memory_utilization": 1.5
        },
        "vLLM, which cannot take the NF4 base": {"grpo_use_vllm": True, "quantize_base": "nf4"},
        "grpo_use_vllm generates GRPO rollouts": {"grpo_use_vllm": True, "objective": "sft"},
    }
    for says, overrides in refused.items():
        found = errors(**overrides)
        assert len(found) == 1 and says in found[0], (overrides, found)
    params = RunParams(
        train_data_uri="p.jsonl", base_model="m", objective="grpo", data_kind="prompts",
        rewards=ARITHMETIC_REWARDS, quantize_base="nf4",
        trainer_overrides={"lora_rank": 8, "grpo_num_iterations": 2, "grpo_use_vllm": True},
    )  # fmt: skip
    config = planned_trainer_config(params)
    assert config.grpo_num_iterations == 2 and config.grpo_use_vllm
    assert any("cannot take the NF4 base" in e for e in run_errors(params))


@pytest.mark.unit
def test_vllm_generation_without_vllm_or_a_gpu_stops_with_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trainer stops before its process group or model exist: vllm is not importable here
    (it is no dependency of this project), or, where it is, this CPU rank has no GPU."""
    import importlib.util

    from trainer.__main__ import main

    code = main([
        "--model", str(tmp_path / "model"), "--data", str(tmp_path / "data"),
        "--output", str(tmp_path / "out"), "--objective", "grpo", "--lora-rank", "8",
        "--rewards", ARITHMETIC_REWARDS, "--grpo-use-vllm", "true",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    says = "needs the vllm package" if importlib.util.find_spec("vllm") is None else "has none"
    assert len(lines) == 1 and says in lines[0], err
    assert not (tmp_path / "out").exists()
