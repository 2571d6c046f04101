"""The pipeline's evaluate step: base vs tuned model on the eval split, report and quality gate.

`run(EvaluateRequest)` is what the `evaluate` KFP component calls; the work is
`components.evaluation.evaluate.run_evaluation` (also `llmft evaluate`). The tuned Model artifact
is the exported Hugging Face model itself; the training curve is in the trainer's run directory,
its `run_uri` metadata (`<run dir>/metrics.jsonl`), DPO's beta in its `dpo_beta` metadata and,
after QLoRA, how DPO's reference was quantized in its `quantize_base` and `compute_dtype`.
The step writes the report to its HTML artifact and logs the scalars to its Metrics artifact;
metrics.json and generations.jsonl go to a temporary directory that is removed.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from components.evaluation.evaluate import run_evaluation
from components.evaluation.gate import GateThresholds
from components.evaluation.harness import HarnessSettings, parse_tasks
from components.evaluation.judge import JudgeSettings
from components.evaluation.outputs import EvaluationResult
from components.evaluation.request import EvaluationRequest
from components.params.by_step import EvaluateParams
from components.preflight.actual_cost import COST_FILE
from components.runtime.secrets import load_hf_token
from components.schedules.finish import add_to_report, finish_run, report_section
from components.serving.mlflow_tracking import end_failed, finish_evaluate, open_tracked_step
from components.steps.component_spec import StepComponent, component_input
from trainer import storage
from trainer.config import TrainConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluateRequest:
    """The `evaluate` component: its run parameters and its own inputs and outputs."""

    params: EvaluateParams
    """The run parameters the evaluate step takes (`steps=(...)` in components/params/run_params.py;
    components/params/step_params.py `for_step`)."""
    tuned_model: Any = component_input("Input[Model]")
    """The Model artifact of the train step (`.uri`, `.metadata`)."""
    dataset: Any = component_input("Input[Dataset]")
    """The packed Dataset artifact (by `.uri`)."""
    metrics: Any = component_input("Output[Metrics]")
    """The Metrics artifact the finite scalars are logged to (`.log_metric`)."""
    report: Any = component_input("Output[HTML]")
    """The HTML artifact the report goes to (by `.path`)."""
    run_id: str = component_input("str", default="")
    """The pipeline run's id (its MLflow run's tag: the evaluate run nests in it)."""
    schedule_record: str = component_input("str", default="")
    """The run's record under work_uri (validate's output; "" for none): completed here, with
    the retention controller's next replay share (components/schedules/finish.py)."""


COMPONENT = StepComponent(
    name="evaluate",
    request=EvaluateRequest,
    returns=(("passed", "bool"),),
    doc="""Evaluate the base and the tuned model on the eval split; write Metrics, an HTML report and
the quality gate's verdict (objective=dpo: with the win rate on the held-out pairs).

Returns:
    passed: whether the tuned model meets the thresholds (and beats the champion, if given).
""",
)


def harness_settings(tasks: str, num_fewshot: int, limit: int) -> HarnessSettings:
    """The run parameters' encoding (-1: task default, 0: all documents) as HarnessSettings."""
    return HarnessSettings(
        tasks=parse_tasks(tasks),
        num_fewshot=None if num_fewshot < 0 else num_fewshot,
        limit=limit or None,
    )


def run(request: EvaluateRequest) -> tuple[bool]:
    """The `evaluate` component: returns `(passed,)`, the gate's verdict.

    A gated hub base model needs the Hugging Face token: read from Secret Manager by name
    (`hf_token_secret` in `project`) unless HF_TOKEN is already set (components/runtime/secrets.py).
    """
    load_hf_token(project=request.params.project, secret=request.params.hf_token_secret)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    metadata = request.tuned_model.metadata
    tuned = storage.normalize(str(metadata.get("model_uri") or request.tuned_model.uri))
    run_dir = storage.normalize(str(metadata.get("run_uri") or "")).rstrip("/")
    tracked, mlflow_run = open_tracked_step(
        request.params.tracking_uri,
        request.params.tracking_token_secret,
        project=request.params.project,
        run_id=request.run_id,
        step="evaluate",
        experiment=request.params.experiment,
    )
    try:
        result = _evaluate(request, tuned, run_dir, tracked, mlflow_run)
    except BaseException:
        end_failed(tracked, mlflow_run)  # the step's and the pipeline's runs end as failed
        raise
    # KFP Metrics (and the Vertex console) take finite numbers only; a diverged perplexity is
    # left out rather than failing the step.
    for name, value in result.metrics.items():
        if math.isfinite(value):
            request.metrics.log_metric(name, float(value))
    request.metrics.log_metric("passed", 1.0 if result.passed else 0.0)
    return (result.passed,)


def _evaluate(
    request: EvaluateRequest, tuned: str, run_dir: str, tracked: Any, mlflow_run: str
) -> EvaluationResult:
    """The evaluation in a scratch directory (the training run's metrics and cost from
    `run_dir`); the schedule's record; the report copied to the step's output and, with
    tracking, logged with metrics.json before the directory goes."""
    metadata = request.tuned_model.metadata
    train_metrics = f"{run_dir}/metrics.jsonl" if run_dir else ""
    train_cost = f"{run_dir}/{COST_FILE}" if run_dir else ""
    with tempfile.TemporaryDirectory(prefix="llmft-evaluate-") as out:
        thresholds = GateThresholds(
            min_loss_improvement=request.params.min_loss_improvement,
            min_exact_match=request.params.min_exact_match,
            min_general_retained=request.params.min_general_retained,
            min_reward_gain=request.params.min_reward_gain,
            max_task_regression=request.params.max_task_regression,
            judge_min_win_rate=request.params.judge_min_win_rate,
        )
        result = run_evaluation(
            EvaluationRequest(
                base=request.params.base_model,
                tuned=tuned,
                data_dir=storage.normalize(request.dataset.uri),
                output_dir=out,
                max_examples=request.params.max_eval_examples,
                train_metrics=train_metrics
                if train_metrics and storage.exists(train_metrics)
                else None,
                train_cost=train_cost if train_cost and storage.exists(train_cost) else None,
                champion=request.params.champion_model or None,
                thresholds=thresholds,
                accelerator_type=request.params.eval_accelerator_type,
                accelerator_count=request.params.eval_accelerator_count,
                harness=harness_settings(
                    request.params.eval_tasks,
                    request.params.eval_num_fewshot,
                    request.params.eval_limit,
                ),
                judge=JudgeSettings(
                    metric=request.params.judge_metric,
                    project=request.params.project,
                    region=request.params.region,
                ),
                objective=request.params.objective,
                dpo_beta=float(metadata.get("dpo_beta") or TrainConfig.dpo_beta),
                max_new_tokens=int(metadata.get("grpo_max_completion_tokens") or 64),
                rewards=request.params.rewards,
                reward_module=request.params.reward_module,
                quantize_base=str(metadata.get("quantize_base") or TrainConfig.quantize_base),
                compute_dtype=str(metadata.get("compute_dtype") or TrainConfig.dtype),
            )
        )
        if request.schedule_record:
            try:
                controller_state = finish_run(
                    request.schedule_record,
                    request.params,
                    metrics=result.metrics,
                    passed=result.passed,
                    checks=result.decision.checks,
                    dataset_uri=storage.normalize(request.dataset.uri),
                    run_dir=run_dir,
                )
                add_to_report(result.report_path, report_section(controller_state))
            except OSError as exc:  # the verdict stands; the schedule's record is what is lost
                log.warning(
                    "could not update the schedule's record %s: %s", request.schedule_record, exc
                )
        shutil.copyfile(result.report_path, request.report.path)
        finish_evaluate(  # inside: the report and metrics.json are logged from `out`
            tracked,
            mlflow_run,
            result=result,
            model_uri=str(metadata.get("model_uri") or request.tuned_model.uri),
            registered_model=request.params.registered_model,
            base_model=request.params.base_model,
        )
    return result
