"""What an evaluation is asked to do (`EvaluationRequest`: the models compared, the data, where the
outputs go, the gate's thresholds, the harness and the judge) and the check of its arguments,
every problem in one ValueError before anything is read (`check_request`). Run by
`run_evaluation` (evaluate.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.evaluation.gate import GateThresholds
from components.evaluation.harness import HarnessSettings, settings_errors
from components.evaluation.judge import JudgeSettings
from components.evaluation.loading import check_model_path
from trainer import storage
from trainer.config import DTYPES, QUANTIZE_BASES, TrainConfig

OBJECTIVES = ("sft", "dpo", "grpo")
"""What the tuned model was trained for (TrainConfig.objective's values)."""


@dataclass(frozen=True)
class EvaluationRequest:
    """What `run_evaluation` compares, where the outputs go, and how."""

    base: str
    """The model before fine-tuning (local dir or gs:// written by save_pretrained)."""
    tuned: str
    """The fine-tuned model exported by the trainer."""
    data_dir: str
    """Packed dataset directory (`llmft preprocess` output); its eval split is scored."""
    output_dir: str
    """Where the outputs go (local or gs://)."""
    max_examples: int = 64
    """Held-out prompts to generate answers for (0 skips generation)."""
    heldout: str | None = None
    """JSONL of prompt/response records for generation; default: the dataset's
    eval_records/part-*.jsonl."""
    train_metrics: str | None = None
    """The trainer's metrics JSONL, plotted as the training loss curve."""
    train_cost: str | None = None
    """The training job's actual cost (the train step's cost.json), kept in metrics.json and
    shown in the report."""
    champion: str | None = None
    """The currently registered model (see components.serving.registry), evaluated the same way and
    compared against when `thresholds.compare_to_champion`."""
    thresholds: GateThresholds = field(default_factory=GateThresholds)
    """The quality gate's thresholds."""
    max_eval_rows: int | None = None
    """Packed eval rows to score (default all)."""
    batch_size: int = 4
    """Packed rows per forward pass."""
    generation_batch_size: int = 16
    """Prompts per generate call."""
    max_new_tokens: int = 64
    """Generation length limit (EOS usually stops earlier)."""
    num_samples: int = 8
    """Side-by-side samples shown in the report."""
    device: str | None = None
    """Torch device; default CUDA (bf16) when present (sharded over all GPUs when several), else
    CPU (fp32)."""
    overwrite: bool = False
    """Replace metrics.json, generations.jsonl and report.html in `output_dir` even when no
    evaluation wrote them (`outputs.check_output_dir`)."""
    device_map: str | dict[str, Any] | None = None
    """An accelerate device map to shard every model with (wins over `device`)."""
    accelerator_type: str = ""
    """The evaluation machine's accelerator (Vertex name, e.g. NVIDIA_L4) for the memory check;
    "" measures the GPUs this process sees (none: no check)."""
    accelerator_count: int = 0
    """How many of `accelerator_type` the machine has."""
    harness: HarnessSettings = field(default_factory=HarnessSettings)
    """lm-evaluation-harness tasks run on every model (none by default)."""
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    """The optional pairwise judge (off by default)."""
    objective: str = TrainConfig.objective
    """What the tuned model was trained for: "sft", or "dpo" (the data must be preference pairs;
    the win rate and reward margin on them are added, and the eval loss is DPO's)."""
    dpo_beta: float = TrainConfig.dpo_beta
    """DPO's beta, as trained with: scales the implicit rewards (the margin and the loss, not
    the win rate)."""
    rewards: str = ""
    """objective=grpo: the run's built-in rewards (JSON, trainer/grpo/rewards.py)."""
    reward_module: str = ""
    """objective=grpo: the run's reward module (PATH[:FUNCTION]), loaded by the evaluation."""
    quantize_base: str = TrainConfig.quantize_base
    """The trainer's `quantize_base`: with "nf4" (QLoRA) DPO's reference is the base with its
    decoder blocks' linear weights through NF4 and back, as the trainer's reference was."""
    compute_dtype: str = TrainConfig.dtype
    """The trainer's compute dtype (summary.json's `compute_dtype`), which an NF4 reference is
    de-quantized to; "auto" resolves as the trainer does on this evaluation's device."""


def check_request(request: EvaluationRequest) -> None:
    """Collect every argument error of `request` and raise them together (ValueError), before
    anything is read."""
    errors: list[str] = []
    for what, path in (
        ("base model", request.base),
        ("tuned model", request.tuned),
        ("champion model", request.champion),
    ):
        if path is None:
            continue
        try:
            check_model_path(path, what)
        except ValueError as exc:
            errors.append(str(exc))
    if not request.data_dir:
        errors.append("data directory is empty: pass the output directory of `llmft preprocess`")
    for what, path in (
        ("held-out file", request.heldout),
        ("training metrics file", request.train_metrics),
    ):
        if path and not storage.exists(path):
            errors.append(f"{what} {path!r} does not exist")
    if request.max_examples < 0:
        errors.append(f"max_examples must be >= 0 (0 skips generation), got {request.max_examples}")
    if request.max_eval_rows is not None and request.max_eval_rows < 1:
        errors.append(f"max_eval_rows must be >= 1 or unset, got {request.max_eval_rows}")
    for name, value in (
        ("batch_size", request.batch_size),
        ("generation_batch_size", request.generation_batch_size),
        ("max_new_tokens", request.max_new_tokens),
    ):
        if value < 1:
            errors.append(f"{name} must be >= 1, got {value}")
    if request.num_samples < 0:
        errors.append(f"num_samples must be >= 0, got {request.num_samples}")
    try:
        request.thresholds.validate()
    except ValueError as exc:
        errors.append(str(exc))
    errors += settings_errors(request.harness) + request.judge.errors()
    if request.accelerator_count < 0:
        errors.append(f"accelerator_count must be >= 0, got {request.accelerator_count}")
    if request.objective not in OBJECTIVES:
        errors.append(
            f"objective must be one of {', '.join(OBJECTIVES)}, got {request.objective!r}"
        )
    if request.objective == "grpo" and not (request.rewards.strip() or request.reward_module):
        errors.append("objective=grpo is evaluated by its rewards: give rewards or reward_module")
    if not request.dpo_beta > 0:
        errors.append(f"dpo_beta must be > 0, got {request.dpo_beta}")
    if request.quantize_base not in QUANTIZE_BASES:
        errors.append(
            f"quantize_base must be one of {', '.join(QUANTIZE_BASES)}, "
            f"got {request.quantize_base!r}"
        )
    if request.compute_dtype not in DTYPES:
        errors.append(
            f"compute_dtype must be one of {', '.join(DTYPES)}, got {request.compute_dtype!r}"
        )
    if errors:
        raise ValueError("; ".join(errors))
