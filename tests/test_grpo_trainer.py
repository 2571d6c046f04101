"""objective=grpo in `python -m trainer` on the tiny model, CPU: rollouts, rewards from a user's
reward module (the prompts' columns reach it), the clipped loss with a KL term to the base,
checkpoints, exact resume, SIGTERM, the held-out reward at the end; bad settings and a failing
reward stop with one `error:` line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_trainer_single import REPO, run_trainer
from trainer_pause.sitecustomize import pause_env

from beam_preprocess.prompt_records import write_dataset
from components.runtime.ports import ReservedPort
from trainer.grpo.tasks import arithmetic

pytestmark = pytest.mark.slow

REWARD = """
def reward(completions, prompts, **columns):
    # the prompts dataset's columns arrive, one value per completion
    assert len(columns["answer"]) == len(completions) and all(isinstance(a, str) for a in columns["answer"])
    return [float(len(c) % 3) for c in completions]

def broken(completions, prompts, **columns):
    return [1 / 0 if i == "arith-0-5" else 0.0 for i in columns["id"]]

def short(completions, prompts, **columns):
    return [0.0]
"""

SETTINGS = (
    "--objective", "grpo", "--lora-rank", "8", "--grpo-group-size", "4",
    "--grpo-max-completion-tokens", "8", "--grpo-beta", "0.1", "--grpo-temperature", "1.5",
    "--lr", "5e-3", "--max-steps", "4", "--checkpoint-every", "2", "--keep-checkpoints", "5",
)  # fmt: skip
QLORA = ("--quantize-base", "nf4")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("prompts")
    records = arithmetic(40, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    write_dataset(str(out / "data"), tokenizer, {"train": records[:32], "eval": records[32:]}, 64)
    (out / "reward.py").write_text(REWARD)
    return out


def metrics(out: Path) -> dict[int, dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "loss" in r}


def grpo(model: Path, prompts: Path, out: Path, *extra: str, function: str = "reward") -> Any:
    module = f"--reward-module={prompts / 'reward.py'}:{function}"
    return run_trainer(model, prompts / "data", out, *SETTINGS, module, *extra)


def test_grpo_trains_checkpoints_and_resumes_exactly(
    tmp_path: Path, tiny_model_dir: Path, prompts: Path
) -> None:
    """Two optimizer steps per rollout (grpo_num_iterations=2): steps 1 and 3 generate, 2 and 4
    train again on the same completions against their old log-probs; a checkpoint every step,
    so step 1's holds the rollout that step 2 still trains on."""
    full = tmp_path / "full"
    iterations = ("--grpo-num-iterations", "2", "--checkpoint-every", "1")
    proc = grpo(tiny_model_dir, prompts, full, *iterations)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = metrics(full)
    assert sorted(first) == [1, 2, 3, 4]
    assert any(m["grad_norm"] > 0 for m in first.values())  # rewards differ within groups
    assert first[1]["kl"] == 0.0  # zero-initialized adapters: the policy is the reference
    assert any(m["kl"] > 0 for m in first.values())
    for step, m in first.items():
        assert m["train_s"] > 0 and 0 <= m["pass_rate"] <= 1
        assert (m["generate_s"] > 0) == (step % 2 == 1)  # a rollout every second step
    for step in (2, 4):  # the same completions: the same rewards, the same tokens
        for key in ("reward", "pass_rate", "completion_tokens"):
            assert first[step][key] == first[step - 1][key], (step, key)
    # A rollout's first step has ratio 1 (nothing clipped); its second, after an update, clips.
    assert first[1]["clip_ratio"] == first[3]["clip_ratio"] == 0.0 < first[2]["clip_ratio"]
    summary = json.loads((full / "summary.json").read_text())
    assert summary["objective"] == "grpo" and "eval_reward" in summary
    assert summary["generate_s_total"] > 0 and summary["train_s_total"] > 0
    assert summary["eval_loss"] == -summary["eval_reward"]
    assert (full / "model/adapter/adapter_config.json").exists()
    check_evaluation(tmp_path, tiny_model_dir, prompts, summary)

    # Resume from step 1's checkpoint: step 2 trains on the saved rollout, step 3 generates the
    # same new one (RNG restored): the same rewards and updates.
    resumed = tmp_path / "resumed"
    step1 = full / "checkpoints/step-00000001"
    assert (step1 / "rollouts/rank-00000.pt").exists()
    assert not (full / "checkpoints/step-00000002/rollouts").exists()  # none pending there
    shutil.copytree(step1, resumed / "checkpoints/step-00000001")
    proc = grpo(tiny_model_dir, prompts, resumed, *iterations)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = metrics(resumed)
    assert sorted(again) == [2, 3, 4]
    for step in (2, 3, 4):
        for key in ("reward", "grad_norm", "loss", "kl"):
            assert again[step][key] == pytest.approx(first[step][key], abs=1e-6), (step, key)


def test_grpo_with_qlora_sigterm_saves_and_the_rerun_finishes(
    tmp_path: Path, tiny_model_dir: Path, prompts: Path
) -> None:
    """QLoRA (an NF4 base): rollouts on the 4-bit base with the adapters, the KL term's reference
    the same base with the adapters off; SIGTERM after step 2 saves, the rerun resumes and
    exports the merged model."""
    out, paused = tmp_path / "run", tmp_path / "paused"
    paused.mkdir()
    port = ReservedPort()
    env = {
        **pause_env(1, str(paused)), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port.port), "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    command = [
        sys.executable, "-m", "trainer", "--model", str(tiny_model_dir),
        "--data", str(prompts / "data"), "--output", str(out), "--micro-batch-size", "2",
        "--log-every", "1", "--tensorboard", "false", *SETTINGS, *QLORA,
        f"--reward-module={prompts / 'reward.py'}",
    ]  # fmt: skip
    with port:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        while not (paused / "paused.rank0").exists():
            if proc.poll() is not None:
                pytest.fail("the run ended before it was preempted:\n" + proc.stderr.read()[-3000:])
            time.sleep(0.1)  # polling for the file, not waiting for time to pass
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "SIGTERM: saved step 2" in err
    proc = grpo(tiny_model_dir, prompts, out, *QLORA)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 4
    steps = metrics(out)
    assert any(m["kl"] > 0 for m in steps.values()) and any(
        m["grad_norm"] > 0 for m in steps.values()
    )
    assert (out / "model/model.safetensors").exists() and (out / "model/adapter").is_dir()


@pytest.mark.parametrize(
    ("function", "says"),
    [
        ("broken", "reward broken ("),
        ("short", "returned 1 values for"),
    ],
)
def test_a_failing_reward_stops_with_one_error_line(
    tmp_path: Path, tiny_model_dir: Path, prompts: Path, function: str, says: str
) -> None:
    proc = grpo(
        tiny_model_dir, prompts, tmp_path / "run", "--no-shuffle", "--max-steps", "3",
        function=function,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], proc.stderr[-2000:]
    if function == "broken":
        assert "arith-0-5" in errors[0] and "ZeroDivisionError" in errors[0]


def test_bad_grpo_settings_exit_2_before_anything_starts(
    tmp_path: Path, tiny_model_dir: Path, prompts: Path
) -> None:
    cases = {
        ("--grpo-group-size", "1"): "grpo_group_size must be >= 2",
        ("--rewards", ""): "objective=grpo needs a reward",
        ("--rewards", '[{"name": "nope"}]'): "unknown reward 'nope'",
    }
    for extra, says in cases.items():
        module = () if extra[0] == "--rewards" else (f"--reward-module={prompts / 'reward.py'}",)
        proc = run_trainer(
            tiny_model_dir, prompts / "data", tmp_path / "bad", *SETTINGS, *module, *extra
        )
        assert proc.returncode == 2 and says in proc.stderr, (extra, proc.stderr[-2000:])


def check_evaluation(tmp_path: Path, base: Path, prompts: Path, summary: dict[str, Any]) -> None:
    """The evaluate step's view of the run: mean reward and pass rate of base and tuned on the
    held-out prompts, scored by the same reward module (loaded by the evaluation), the tuned
    model's the trainer's own end-of-run numbers; the gate's min_reward_gain."""
    from components.evaluation.evaluate import run_evaluation
    from components.evaluation.gate import GateThresholds
    from components.evaluation.request import EvaluationRequest

    def evaluation(name: str, gain: float) -> Any:
        request = EvaluationRequest(
            base=str(base), tuned=summary["model_dir"], data_dir=str(prompts / "data"),
            output_dir=str(tmp_path / name), objective="grpo", device="cpu",
            reward_module=str(prompts / "reward.py"), max_new_tokens=8,
            thresholds=GateThresholds(min_reward_gain=gain),
            train_metrics=str(Path(summary["model_dir"]).parent / "metrics.jsonl"),
        )  # fmt: skip
        return run_evaluation(request)

    result = evaluation("eval", 0.0)
    m = result.metrics
    assert m["tuned_mean_reward"] == pytest.approx(summary["eval_reward"], abs=1e-6)
    assert m["tuned_pass_rate"] == pytest.approx(summary["eval_pass_rate"], abs=1e-6)
    assert m["mean_reward_delta"] == pytest.approx(m["tuned_mean_reward"] - m["base_mean_reward"])
    assert m["generation_examples"] == 8 and "base_pass_rate" in m
    # The report says where the training time went (summary.json's totals beside the metrics).
    generating = f"generating {summary['generate_s_total']:,.0f} s, training"
    assert generating in Path(result.report_path).read_text()
    gated = evaluation("gated", 10.0)  # a reward of 0..2 cannot rise by 10
    assert not gated.passed
    (check,) = [c for c in gated.decision.checks if c["name"] == "reward_gain"]
    assert not check["passed"] and "required gain >= 10" in check["detail"]


def test_grpo_with_sharded_weights_on_two_processes(
    tmp_path: Path, tiny_model_dir: Path, prompts: Path
) -> None:
    """FSDP2 over two ranks: each rank's rollouts run on gathered weights with `synced_gpus`
    (every rank makes the same number of forwards until all are done), the KL term's reference
    pass too; the step's numbers are global (every rank logs the same)."""
    out = tmp_path / "two"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "-m", "trainer",
         "--model", str(tiny_model_dir), "--data", str(prompts / "data"), "--output", str(out),
         "--micro-batch-size", "1", "--log-every", "1", "--tensorboard", "false",
         "--data-parallel", "shard", *SETTINGS, "--max-steps", "3",
         f"--reward-module={prompts / 'reward.py'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = metrics(out)
    assert sorted(steps) == [1, 2, 3] and any(m["grad_norm"] > 0 for m in steps.values())
    assert any(m["kl"] > 0 for m in steps.values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and "eval_reward" in summary
