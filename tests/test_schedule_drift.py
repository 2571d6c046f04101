"""The retention controller over a sequence of scheduled runs whose data drift on purpose: without
the controller the gate refuses every run for forgetting; with it the replay share rises and the
gate passes within four runs (docs/schedules.md, "What the drift test shows").

Each run does what a scheduled run does, in this process, on a tiny model: the validate step's
plan (components/schedules/plan.py: the replay share from the controller's state, the mix),
real preprocessing (beam_preprocess on the DirectRunner: the mix sampled by tokens), the real
trainer (`trainer.train.run`, the function `python -m trainer` calls, here one process with a
gloo group), the real evaluation and quality gate (`min_general_retained` on the packaged
general probes) and the evaluate step's finish (components/schedules/finish.py: the run's
record, the controller's next share). The sequence stops at the first run that passes, so under
`base_model=latest-registered` every run starts from the base. The "general knowledge" is what
the base was tuned on: the probes' questions with their accepted answers, which is also the
replay source; the windows are the sample data's tasks, two per window, a different pair each
run.

Cheap on purpose: a 0.7M-parameter model (the session tokenizer, 64 wide, 2 layers), 64-token
rows, 30 training steps a run, and the first run trained once (with and without the controller
it is the same run: no replay yet).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from eval_fixtures import one_torch_thread

from components.evaluation.evaluate import run_evaluation
from components.evaluation.gate import GateThresholds
from components.evaluation.general_probes import load_probes
from components.evaluation.request import EvaluationRequest
from components.runtime.ports import LOOPBACK, ReservedPort
from components.schedules import history, state
from components.schedules.finish import finish_run
from components.schedules.plan import plan_run

pytestmark = pytest.mark.slow

SEQ_LEN = 64
BASE_STEPS, BASE_LR = 150, 1e-2
RUN_STEPS, RUN_LR = 30, 2e-3
MIN_RETAINED = 0.5
"""The gate's `min_general_retained`, and so the controller's target."""
WINDOWS = (
    ("add", "subtract"), ("multiply", "sort"), ("reverse", "count_letters"), ("convert_units", "add")
)  # fmt: skip
"""A new pair of tasks per run. Four windows: the figures depend on the CPU's kernels, and the
controller's shares 0.05, 0.1, 0.2 give a run with replay three tries to pass."""
WINDOW_RECORDS = 300
PLACEHOLDER = "{{$.pipeline_job_schedule_time_utc}}"


@dataclass(frozen=True)
class Outcome:
    share: float
    """The replay share the run used (the validate step's plan)."""
    retained: float
    passed: bool


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def drift(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, sample_data_dir: Path):
    """The small model, the general set, the three windows, and the base tuned on the set."""
    root = tmp_path_factory.mktemp("drift")
    model = _small_model(tiny_model_dir, root / "small")
    general = root / "general.jsonl"
    _write(general, [{"prompt": p.question, "response": p.answers[0]} for p in load_probes()])
    records = [json.loads(line) for line in (sample_data_dir / "train.jsonl").open()]
    for number, tasks in enumerate(WINDOWS, start=1):
        chosen = [r for r in records if r["task"] in tasks][:WINDOW_RECORDS]
        _write(root / "windows" / _day(number) / "data.jsonl", chosen)
    data = _preprocess(model, str(general), root / "general_data", "", "--eval-fraction=0")
    base = _train(model, data, root / "base", BASE_STEPS, BASE_LR, eval_at_end=False)
    return SimpleNamespace(root=root, general=general, base=base, model=model)


def _small_model(tiny_model_dir: Path, out: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(tiny_model_dir)
    config.update(
        {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _day(number: int) -> str:
    return f"2026-12-0{number}"


def _preprocess(tokenizer: Path, uri: str, out: Path, mix: str, *extra: str) -> Path:
    from beam_preprocess.pipeline import run

    argv = [f"--input={uri}", f"--output={out}", f"--tokenizer={tokenizer}"]
    argv += [f"--seq-len={SEQ_LEN}", f"--train-data-mix={mix}", "--direct_num_workers=1", *extra]
    run(argv)
    return out


def _train(model: Path, data: Path, out: Path, steps: int, lr: float, **more: Any) -> Path:
    """The trainer's own entry (`trainer.train.run`) as rank 0 of 1, in this process."""
    import os

    from trainer.config import TrainConfig
    from trainer.train import run

    config = TrainConfig(
        model=str(model), data=str(data), output=str(out), max_steps=steps, lr=lr,
        micro_batch_size=8, warmup_steps=0, min_lr_ratio=1.0, log_every=10,
        tensorboard=False, checkpoint_at_end=False, **more,
    )  # fmt: skip
    port = ReservedPort()  # held for the run: the trainer's store takes it over
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": LOOPBACK}
    saved = {key: os.environ.get(key) for key in [*env, "MASTER_PORT"]}
    sigterm = signal.getsignal(signal.SIGTERM)  # the trainer installs its own
    try:
        with port:
            os.environ.update(env, MASTER_PORT=str(port.port))
            assert run(config) == 0
    finally:
        signal.signal(signal.SIGTERM, sigterm)
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    return out


def _params(drift: SimpleNamespace, work_uri: str) -> SimpleNamespace:
    """The run parameters plan_run and finish_run read (a schedule's, as written)."""
    return SimpleNamespace(
        work_uri=work_uri,
        train_data_uri=str(drift.root / "windows" / PLACEHOLDER / "*.jsonl"),
        registered_model="drift",
        register_model=False,
        project="",
        region="us-central1",
        replay_fraction=0.0,
        replay_source=str(drift.general),
        retention_target=0.0,
        min_general_retained=MIN_RETAINED,
        min_new_records=0,
        train_data_mix="",
    )


def _run(drift: SimpleNamespace, params: SimpleNamespace, number: int, base: Path) -> Outcome:
    """One scheduled run: plan, preprocess, train from `base`, evaluate and gate, finish."""
    day = _day(number)
    window = params.train_data_uri.replace(PLACEHOLDER, day)
    plan, problems = plan_run(params, window, f"run-{number}", day, lambda _uri: [])
    assert problems == [] and plan.proceed
    tag = f"{'with' if params.work_uri else 'without'}-{number}"
    data = _preprocess(drift.model, window, drift.root / tag / "data", plan.train_data_mix)
    run_dir = _train(base / "model", data, drift.root / tag / "train", RUN_STEPS, RUN_LR)
    result = run_evaluation(
        EvaluationRequest(
            base=str(base / "model"), tuned=str(run_dir / "model"), data_dir=str(data),
            output_dir=str(drift.root / tag / "eval"), max_examples=0, max_eval_rows=4,
            thresholds=GateThresholds(min_general_retained=MIN_RETAINED),
        )
    )  # fmt: skip
    if plan.record_uri:
        finish_run(
            plan.record_uri, params, metrics=result.metrics, passed=result.passed,
            checks=result.decision.checks, dataset_uri=str(data), run_dir=str(run_dir),
        )  # fmt: skip
    retained = result.metrics["general_retained"]
    return Outcome(plan.replay_fraction, retained, result.passed)


def _sequence(
    drift: SimpleNamespace, params: SimpleNamespace, runs: int, first: Outcome | None = None
) -> list[Outcome]:
    """Up to `runs` runs on the drifting windows, up to the first that passes. Every run starts
    from the base: with `base_model=latest-registered` a run continues from the last model that
    passed, and none has before the sequence stops."""
    outcomes: list[Outcome] = []
    for number in range(1, runs + 1):
        # the first run is the same with or without the controller: same base and window, no
        # replay yet
        outcome = first if number == 1 and first else _run(drift, params, number, drift.base)
        outcomes.append(outcome)
        if outcome.passed:
            break
    return outcomes


def test_the_controller_turns_a_forgetting_schedule_into_a_passing_one(
    drift: SimpleNamespace, capsys: pytest.CaptureFixture[str]
):
    work_uri = str(drift.root / "work")
    with_controller = _sequence(drift, _params(drift, work_uri), len(WINDOWS))
    # Without the controller, as many runs: no state under work_uri, the share stays at
    # replay_fraction (0).
    without = _sequence(drift, _params(drift, ""), len(with_controller), first=with_controller[0])
    with capsys.disabled():
        for name, runs in (("without", without), ("with", with_controller)):
            print(f"\n{name} the controller: " + ", ".join(
                f"run {i}: replay {o.share:.2f} retained {o.retained:.3f} "
                f"{'passed' if o.passed else 'refused'}" for i, o in enumerate(runs, 1)
            ))  # fmt: skip
    assert len(without) == len(with_controller)
    assert all(o.share == 0.0 for o in without)
    assert not any(o.passed for o in without)
    assert all(o.retained < MIN_RETAINED for o in without)
    # With it: the first run forgets, the share doubles from nothing (0.05, 0.1, 0.2) while the
    # gate refuses, and a run with replay passes (the sequence stops there).
    assert not with_controller[0].passed and with_controller[0].share == 0.0
    assert with_controller[-1].passed, with_controller
    first_pass = len(with_controller) - 1
    shares = [o.share for o in with_controller]
    assert shares == [0.0, 0.05, 0.1, 0.2][: first_pass + 1]
    assert with_controller[first_pass].retained >= MIN_RETAINED
    assert with_controller[first_pass].retained > without[first_pass].retained
    # The records say the same: refused for forgetting, then passed, the shares used.
    root = state.schedule_root(
        work_uri, state.schedule_key(_params(drift, "").train_data_uri, "drift")
    )
    rows = history.rows(state.runs(root))
    assert [r["verdict"] for r in rows][: first_pass + 1] == (
        ["refused (forgetting)"] * first_pass + ["passed"]
    )
    assert [r["replay_fraction"] for r in rows][: first_pass + 1] == shares
    assert all(r["steps"] == RUN_STEPS and r["tokens"] for r in rows)
