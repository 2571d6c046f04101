"""The run parameters of the evaluation step and its quality gate: a section of `RunParams`
(components/params/run_params.py inherits it), declared like the rest (`param(..., steps=...)`).
"""

from __future__ import annotations

from dataclasses import dataclass

from components.params.param_schema import param
from components.params.serving_params import LATEST_REGISTERED
from components.platform.platform_facts import JudgeMetric


@dataclass(frozen=True)
class EvaluationParams:
    """Base vs tuned on the held-out data, harness tasks and a judge; the gate's thresholds."""

    eval_accelerator_type: str = param(
        "NVIDIA_L4",
        "Accelerator of the evaluation step on Vertex AI (e.g. NVIDIA_L4, NVIDIA_A100_80GB for "
        "30B+ models); on KFP any GPU node serves it. Evaluation runs in bf16 on a GPU.",
        steps=("evaluate",),
        cloud=True,
    )
    eval_accelerator_count: int = param(
        1,
        "GPUs for the evaluation step (at least 1 in the cloud).",
        ge=0,
        steps=("evaluate",),
        cloud=True,
    )
    max_eval_examples: int = param(
        200,
        "Held-out prompts to generate answers for (bounds evaluation time).",
        ge=1,
        steps=("evaluate",),
    )
    min_loss_improvement: float = param(
        0.0,
        "Quality gate: the tuned eval loss must be below the base's by at least this much.",
        steps=("evaluate",),
    )
    min_exact_match: float = param(
        0.0,
        "Quality gate: the tuned model's exact-match rate on held-out prompts must be at least "
        "this.",
        ge=0.0,
        le=1.0,
        steps=("evaluate",),
    )
    min_reward_gain: float = param(
        0.0,
        "Quality gate for objective=grpo: the tuned model's mean reward on the held-out prompts "
        "must exceed the base's by at least this (0 disables the check).",
        ge=0.0,
        steps=("evaluate",),
    )
    min_general_retained: float = param(
        0.0,
        "Quality gate against forgetting: of the packaged general-knowledge probes the base model "
        "answers correctly, the tuned model must still answer at least this fraction (0 disables "
        "the check; use it for pretrained bases and recurring fine-tunes).",
        ge=0.0,
        le=1.0,
        steps=("evaluate",),
    )
    champion_model: str = param(
        "",
        "Optional model the tuned one must also beat: a model URI, or "
        f'"{LATEST_REGISTERED}" for the newest version of registered_model (recurring '
        "fine-tunes); empty skips the comparison.",
        steps=("evaluate",),
    )
    eval_tasks: str = param(
        "",
        "lm-evaluation-harness tasks run on the base and the tuned model, comma-separated (e.g. "
        "mmlu,arc_easy,hellaswag,gsm8k; the project ships llmft_facts_mc and llmft_facts_gen "
        "over local data); empty runs none. The harness's tasks download their data from the "
        "Hugging Face Hub.",
        steps=("evaluate",),
    )
    eval_num_fewshot: int = param(
        -1,
        "Few-shot examples per harness prompt; -1 uses each task's own default.",
        ge=-1,
        steps=("evaluate",),
    )
    eval_limit: int = param(
        0,
        "Documents per harness task (the first N, bounds evaluation time); 0 runs all.",
        ge=0,
        steps=("evaluate",),
    )
    max_task_regression: float = param(
        100.0,
        "Quality gate on the harness tasks: on each task's headline metric (e.g. mmlu acc) the "
        "tuned model may score at most this many points (0-100) below the base; 100 reports the "
        "tasks without gating.",
        ge=0.0,
        le=100.0,
        steps=("evaluate",),
    )
    judge_metric: JudgeMetric = param(
        "",
        "Pairwise judge of base vs tuned answers to the held-out prompts by the Vertex AI Gen AI "
        'evaluation service, with this pairwise metric (e.g. "text_quality"); empty: no judge.',
        steps=("evaluate",),
        cloud=True,
    )
    judge_min_win_rate: float = param(
        0.0,
        "Quality gate on the judge: the tuned model's win rate against the base (ties count "
        "half) must be at least this (0 disables the check).",
        ge=0.0,
        le=1.0,
        steps=("evaluate",),
        cloud=True,
    )
