"""lm-evaluation-harness tasks (mmlu, arc_easy, hellaswag, gsm8k, ...) on an already loaded model.

`run_tasks` wraps the model the evaluator loaded (one device or sharded, loading.py) in the
harness's `HFLM` and calls `lm_eval.simple_evaluate`, the entry point the harness's maintainers
recommend for pipelines; base and tuned model run the same tasks with the same settings, so their
scores compare. Log-likelihood tasks (multiple choice) and generation tasks both work.

The project ships its own tasks over local data in components/evaluation/tasks/ (`llmft_facts_mc`,
`llmft_facts_gen`): always available, never downloaded. The harness's own tasks download their
data sets from the Hugging Face Hub on first use (the evaluation machine needs that access).

Each task's headline number (`primary_metric`) is its first reported higher-is-better metric, as
the harness orders them (the task's metric_list, then its filters): `acc` for mmlu, arc_easy and
lambada_openai (whose perplexity comes first), `exact_match,strict-match` for gsm8k; a task with
none (wikitext's perplexities) is an error. The gate compares base and tuned on it, in points (x100).
Needs the `eval` extra (`pip install llmft[eval]`).
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROJECT_TASKS_DIR = Path(__file__).with_name("tasks")
"""The project's own task YAMLs (and their JSONL data)."""
INSTALL_HINT = "install the eval extra: pip install 'llmft[eval]'"
_NOT_METRICS = {"name", "alias", "sample_len", "samples"}


@dataclass(frozen=True)
class HarnessSettings:
    """What the harness runs, identical for every model of an evaluation."""

    tasks: tuple[str, ...] = ()
    """Task or group names (the harness's, or the project's in components/evaluation/tasks/)."""
    num_fewshot: int | None = None
    """Few-shot examples per prompt; None: each task's own default."""
    limit: int | None = None
    """Documents per task (the first N); None: all."""
    batch_size: int = 16
    """Requests per forward pass."""

    def describe(self) -> dict[str, Any]:
        return {
            "tasks": list(self.tasks),
            "num_fewshot": self.num_fewshot,
            "limit": self.limit,
            "batch_size": self.batch_size,
        }


def parse_tasks(text: str) -> tuple[str, ...]:
    """`mmlu, arc_easy` -> ("mmlu", "arc_easy"); "" -> () (the harness is off)."""
    names = [name.strip() for name in text.split(",")]
    return tuple(dict.fromkeys(name for name in names if name))


def settings_errors(settings: HarnessSettings) -> list[str]:
    """Problems with the settings that need no model (task names are checked by `check_tasks`)."""
    errors = []
    if settings.num_fewshot is not None and settings.num_fewshot < 0:
        errors.append(f"eval_num_fewshot must be >= 0 or unset, got {settings.num_fewshot}")
    if settings.limit is not None and settings.limit < 1:
        errors.append(f"eval_limit must be >= 1 or unset, got {settings.limit}")
    if settings.batch_size < 1:
        errors.append(f"harness batch size must be >= 1, got {settings.batch_size}")
    return errors


def _project_task_names() -> set[str]:
    return {p.stem for p in PROJECT_TASKS_DIR.glob("*.yaml")}


def task_manager(tasks: tuple[str, ...]) -> Any:
    """The harness's task index with the project's tasks; the harness's own (thousands of YAMLs,
    seconds to index) only when a requested task is not the project's."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ValueError(f"eval_tasks needs lm-evaluation-harness: {INSTALL_HINT}") from None
    defaults = not set(tasks) <= _project_task_names()
    return TaskManager(include_path=str(PROJECT_TASKS_DIR), include_defaults=defaults)


def check_tasks(tasks: tuple[str, ...], manager: Any = None) -> Any:
    """Raise ValueError naming every unknown task, and every name that would report no score of
    its own (before any model loads); return the index.

    A tag (`ai2_arc`, `lambada`) runs its tasks but reports nothing under its own name, and so
    does a group without `aggregate_metric_list`: such names are refused with their tasks listed.
    """
    manager = manager or task_manager(tasks)
    unknown = [name for name in tasks if name not in manager.all_tasks]
    if unknown:
        raise ValueError(
            f"unknown eval_tasks {', '.join(unknown)}: use lm-evaluation-harness task names "
            f"(e.g. mmlu, arc_easy, hellaswag, gsm8k) or the project's "
            f"({', '.join(sorted(_project_task_names()))})"
        )
    tags, groups = set(manager.all_tags), set(manager.all_groups)
    problems = []
    for name in tasks:
        entry = manager.task_index.get(name)
        if name in tags and entry is not None:
            problems.append(f"{name} is a tag: list its tasks ({_listed(entry.tags)})")
        elif (
            name in groups
            and entry is not None
            and isinstance(entry.cfg, dict)
            and not entry.cfg.get("aggregate_metric_list")
        ):
            problems.append(
                f"{name} is a group without an aggregate score: list its tasks "
                f"({_listed(_group_tasks(entry.cfg))})"
            )
    if problems:
        raise ValueError(f"eval_tasks: {'; '.join(problems)}")
    return manager


def _group_tasks(cfg: dict[str, Any]) -> list[str]:
    tasks = cfg.get("task") or []
    tasks = tasks if isinstance(tasks, list) else [tasks]
    return [t if isinstance(t, str) else str(t.get("task", t)) for t in tasks]


def _listed(names: Any, most: int = 8) -> str:
    names = sorted(names)
    more = f", ... {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def run_tasks(model: Any, tokenizer: Any, settings: HarnessSettings, manager: Any = None) -> dict:
    """Run the tasks on a loaded model; return `{task: {metric: value}}` for the requested
    names (a group's own aggregate for groups such as mmlu), plus the headline metric's name
    under `"primary"`."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    manager = manager or check_tasks(settings.tasks)
    # A copy: HFLM may set or add a pad token, and the same tokenizer object serves other models.
    lm = HFLM(pretrained=model, tokenizer=copy.deepcopy(tokenizer), batch_size=settings.batch_size)
    output = lm_eval.simple_evaluate(
        model=lm,
        tasks=list(settings.tasks),
        num_fewshot=settings.num_fewshot,
        limit=settings.limit,
        task_manager=manager,
        log_samples=False,
        bootstrap_iters=0,
    )
    return task_scores(output, settings.tasks)


def task_scores(output: dict[str, Any], tasks: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The requested tasks' numeric metrics from a `simple_evaluate` result, each with its
    headline metric (`primary_metric`, from the result's `higher_is_better`)."""
    results = output["results"]
    directions = output.get("higher_is_better", {})
    scores: dict[str, dict[str, Any]] = {}
    for name in tasks:
        metrics = {
            key: float(value)
            for key, value in results.get(name, {}).items()
            if key not in _NOT_METRICS
            and "_stderr" not in key
            and isinstance(value, int | float)
            and not isinstance(value, bool)
        }
        if not metrics:
            raise ValueError(
                f"the harness reported no metric for eval task {name!r} (a tag, or a group "
                "without aggregate_metric_list? list its tasks instead)"
            )
        primary = primary_metric(metrics, directions.get(name, {}))
        if primary is None:
            raise ValueError(
                f"eval task {name!r} reports no higher-is-better metric "
                f"({', '.join(map(metric_label, metrics))}): its score cannot be compared "
                "in points; use a task scored by accuracy or exact match"
            )
        scores[name] = {"primary": primary, "metrics": metrics}
    return scores


def primary_metric(metrics: dict[str, float], higher_is_better: dict[str, Any]) -> str | None:
    """The headline metric: the first one the harness reported (the task's metric_list order,
    then its filters) that is higher-is-better; None when there is none (perplexity-only tasks).
    lambada_openai reports perplexity before acc: its headline is acc."""
    for key in metrics:
        if higher_is_better.get(key.partition(",")[0]) is True:
            return key
    return None


def metric_label(key: str) -> str:
    """`acc,none` -> `acc`; `exact_match,strict-match` -> `exact_match (strict-match)`."""
    metric, _, filt = key.partition(",")
    return metric if filt in ("", "none") else f"{metric} ({filt})"


def flat_metrics(role: str, scores: dict[str, dict[str, Any]]) -> dict[str, float]:
    """`{role}_task_{task}`: each task's headline metric as a scalar (0..1 for accuracies)."""
    return {
        f"{role}_task_{task}": score["metrics"][score["primary"]]
        for task, score in scores.items()
        if math.isfinite(score["metrics"][score["primary"]])
    }
