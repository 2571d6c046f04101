"""`llmft evaluate`: the pipeline's evaluate step run by hand, a thin layer over
`components.evaluation.evaluate.run_evaluation`. Its options are declared once each below
(typer reads the help from the `Annotated` alias), grouped as the request groups them: the
models and data, the quality gate, the harness tasks, and what the tuned model was trained as.

The evaluation package (~0.6 s to import with its step) is imported inside the command so
`llmft --help` is fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from pipelines.cli.common import print_json, user_errors
from pipelines.cli.steps import ExperimentOpt, TrackingUriOpt, check_tracking_uri
from trainer.config import TrainConfig
from trainer.storage import disk_errors_named

# lazy imports: each command imports the modules of its work in its body, so that `llmft --help`
# (0.4 s) does not pay for them: the evaluation and MLflow modules take +0.26 s to import after
# pipelines.cli (min of 3, shared 2-core machine).

if TYPE_CHECKING:  # the evaluation package loads only when the command runs (see evaluate_cmd)
    from components.evaluation.outputs import EvaluationResult
    from components.evaluation.request import EvaluationRequest

RunIdOpt = Annotated[
    str, typer.Option(help="With --tracking-uri: the run (llmft train --run-id) to log to.")
]
RegisteredModelOpt = Annotated[
    str, typer.Option(help="MLflow registered model a passing model becomes a version of.")
]

# --- the models, the data and the outputs -------------------------------------------------------
Base = Annotated[str, typer.Option(help="Base model directory or .gguf file (local or gs://).")]
Tuned = Annotated[str, typer.Option(help="Fine-tuned model directory (the trainer's model/).")]
Data = Annotated[str, typer.Option(help="Packed dataset directory (llmft preprocess).")]
Output = Annotated[
    str, typer.Option(help="Where to write metrics.json, generations.jsonl, report.html.")
]
Heldout = Annotated[
    str | None,
    typer.Option(help="Prompt/response JSONL for generation (default: DATA/eval_records/)."),
]
MaxExamples = Annotated[int, typer.Option(help="Held-out prompts to generate for (0: loss only).")]
MaxEvalRows = Annotated[int | None, typer.Option(help="Packed eval rows to score (default: all).")]
TrainMetrics = Annotated[str | None, typer.Option(help="Trainer metrics JSONL to plot.")]
Champion = Annotated[
    str | None, typer.Option(help="Currently registered model to compare against.")
]
MaxNewTokens = Annotated[int, typer.Option(help="Generation length limit.")]
Device = Annotated[
    str | None, typer.Option(help="torch device (default: cuda if present, else cpu).")
]
Overwrite = Annotated[
    bool,
    typer.Option(
        help="Replace metrics.json, generations.jsonl and report.html in --output even "
        "when no llmft evaluation wrote them."
    ),
]
AcceleratorType = Annotated[
    str,
    typer.Option(
        help="Evaluation GPU (e.g. NVIDIA_L4) to check the models fit (default: measured)."
    ),
]
AcceleratorCount = Annotated[int, typer.Option(help="GPUs of --accelerator-type.")]

# --- the quality gate ---------------------------------------------------------------------------
MinLossImprovement = Annotated[
    float, typer.Option(help="Gate: base loss - tuned loss must be >= this.")
]
MinExactMatch = Annotated[
    float, typer.Option(help="Gate: tuned exact match must be >= this (0 disables).")
]
MinGeneralRetained = Annotated[
    float,
    typer.Option(
        help="Gate: fraction of the general probes the base answers that the tuned "
        "model must still answer (0 disables)."
    ),
]
RequirePass = Annotated[bool, typer.Option(help="Exit 1 when the quality gate fails.")]
MaxTaskRegression = Annotated[
    float,
    typer.Option(help="Gate: tuned may score at most this many points below base per task."),
]

# --- lm-evaluation-harness tasks ----------------------------------------------------------------
EvalTasks = Annotated[
    str,
    typer.Option(help="lm-evaluation-harness tasks, comma-separated (e.g. mmlu,arc_easy)."),
]
NumFewshot = Annotated[
    int, typer.Option(help="Few-shot examples per harness prompt (-1: task default).")
]
Limit = Annotated[int, typer.Option(help="Documents per harness task (0: all).")]

# --- what the tuned model was trained as --------------------------------------------------------
Objective = Annotated[
    str,
    typer.Option(
        help="What --tuned was trained for: sft, dpo (a preference dataset: win rate and "
        "reward margin of the held-out pairs, base as reference), or grpo (a prompts dataset: "
        "mean reward and pass rate of the held-out prompts, scored by --rewards / "
        "--reward-module)."
    ),
]
Rewards = Annotated[
    str, typer.Option(help="objective grpo: the built-in rewards, a JSON list (docs/grpo.md).")
]
RewardModule = Annotated[
    str,
    typer.Option(help="objective grpo: a reward function file, PATH[:FUNCTION] (docs/grpo.md)."),
]
MinRewardGain = Annotated[
    float,
    typer.Option(help="objective grpo: the gate's minimum gain of the mean reward (0: off)."),
]
DpoBeta = Annotated[
    float, typer.Option(help="DPO's beta as trained with (scales the implicit rewards).")
]
QuantizeBase = Annotated[
    str,
    typer.Option(
        help="The run's quantize_base (its summary.json): nf4 makes DPO's reference the "
        "base through NF4 and back, as the trainer's was."
    ),
]
ComputeDtype = Annotated[
    str,
    typer.Option(
        help="The trainer's compute dtype (summary.json's compute_dtype: bf16 or fp32) an "
        "NF4 reference is de-quantized to; auto: bf16 on CUDA, else fp32."
    ),
]


@user_errors
def evaluate_cmd(
    base: Base,
    tuned: Tuned,
    data: Data,
    output: Output,
    heldout: Heldout = None,
    max_examples: MaxExamples = 64,
    max_eval_rows: MaxEvalRows = None,
    train_metrics: TrainMetrics = None,
    champion: Champion = None,
    min_loss_improvement: MinLossImprovement = 0.0,
    min_exact_match: MinExactMatch = 0.0,
    min_general_retained: MinGeneralRetained = 0.0,
    max_new_tokens: MaxNewTokens = 64,
    device: Device = None,
    require_pass: RequirePass = False,
    overwrite: Overwrite = False,
    eval_tasks: EvalTasks = "",
    num_fewshot: NumFewshot = -1,
    limit: Limit = 0,
    max_task_regression: MaxTaskRegression = 100.0,
    accelerator_type: AcceleratorType = "",
    accelerator_count: AcceleratorCount = 1,
    objective: Objective = TrainConfig.objective,
    dpo_beta: DpoBeta = TrainConfig.dpo_beta,
    rewards: Rewards = "",
    reward_module: RewardModule = "",
    min_reward_gain: MinRewardGain = 0.0,
    quantize_base: QuantizeBase = TrainConfig.quantize_base,
    compute_dtype: ComputeDtype = TrainConfig.dtype,
    tracking_uri: TrackingUriOpt = "",
    experiment: ExperimentOpt = "",
    run_id: RunIdOpt = "",
    registered_model: RegisteredModelOpt = "",
) -> None:
    """Compare base and fine-tuned models on the eval split: loss, exact match, chrF, standard
    tasks (lm-evaluation-harness), DPO win rate, GRPO mean reward, HTML report."""
    import logging

    # the evaluation package and its step (~0.6 s to import): only when the command runs
    from components.evaluation.gate import GateThresholds
    from components.evaluation.request import EvaluationRequest
    from components.steps.evaluate import harness_settings

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    check_tracking_uri(tracking_uri)
    if tracking_uri and not run_id:
        raise ValueError("--tracking-uri needs --run-id (the run `llmft train` logged)")
    thresholds = GateThresholds(
        min_loss_improvement=min_loss_improvement,
        min_exact_match=min_exact_match,
        min_general_retained=min_general_retained,
        max_task_regression=max_task_regression,
        min_reward_gain=min_reward_gain,
    )
    request = EvaluationRequest(
        base=base, tuned=tuned, data_dir=data, output_dir=output, heldout=heldout,
        max_examples=max_examples, max_eval_rows=max_eval_rows, train_metrics=train_metrics,
        champion=champion, thresholds=thresholds, max_new_tokens=max_new_tokens, device=device,
        overwrite=overwrite,
        harness=harness_settings(eval_tasks, num_fewshot, limit),
        accelerator_type=accelerator_type, accelerator_count=accelerator_count,
        objective=objective, dpo_beta=dpo_beta, quantize_base=quantize_base,
        compute_dtype=compute_dtype, rewards=rewards, reward_module=reward_module,
    )  # fmt: skip
    tracking = {"uri": tracking_uri, "run_id": run_id, "experiment": experiment}
    result = _evaluate_tracked(request, registered_model=registered_model, **tracking)
    print_json(
        {
            "passed": result.passed,
            "failures": result.decision.failures,
            "metrics": result.metrics,
            "report": result.report_path,
            "metrics_file": result.metrics_path,
        }
    )
    if require_pass and not result.passed:
        raise typer.Exit(1)


def _evaluate_tracked(
    request: EvaluationRequest, *, uri: str, run_id: str, experiment: str, registered_model: str
) -> EvaluationResult:
    """Run the evaluation, in the MLflow run of `run_id` when `uri` is set (ended as failed when
    the evaluation fails); a failing disk is one line naming it."""
    from components.evaluation.evaluate import run_evaluation
    from components.serving.mlflow_tracking import (
        end_failed,
        finish_evaluate,
        open_step,
        run_tags,
    )

    tags = run_tags(base_model=request.base, backend="local", dataset_uri=request.data_dir)
    tracked, mlflow_run = open_step(uri, run_id, "evaluate", experiment=experiment, tags=tags)
    try:
        with disk_errors_named(request.output_dir):  # any write of it: one line naming the disk
            result = run_evaluation(request)
    except BaseException:
        end_failed(tracked, mlflow_run)
        raise
    finish_evaluate(
        tracked,
        mlflow_run,
        result=result,
        model_uri=request.tuned,
        registered_model=registered_model,
        base_model=request.base,
    )
    return result
