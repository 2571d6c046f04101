"""The quality gate: does the fine-tuned model deserve to be registered?

Every check is against a threshold the user sets; a check whose metric was not computed fails
rather than passing silently (a gate that asks for exact match must see generation results).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GateThresholds:
    """What "better" means for this fine-tune."""

    min_loss_improvement: float = 0.0
    """The tuned model's eval loss must be below the base model's by at least this (nats/token).
    0 means "not worse"; a positive value demands a real improvement."""
    min_exact_match: float = 0.0
    """The tuned model's exact match on held-out prompts must be at least this (0..1). 0 disables
    the check."""
    compare_to_champion: bool = True
    """When a champion (latest registered version) was evaluated, the tuned model must not be
    worse than it: loss at most champion loss + champion_tolerance, exact match at least the
    champion's minus champion_tolerance."""
    champion_tolerance: float = 0.0
    """Slack for the champion comparison (nats/token for loss, fraction for exact match)."""
    min_general_retained: float = 0.0
    """Forgetting check: of the general probes the base model answers correctly
    (components/evaluation/general_probes.py), the tuned model must still answer at least this
    fraction (0..1). 0 disables the check and skips the probes (tiny models answer none)."""
    max_task_regression: float = 100.0
    """lm-evaluation-harness tasks (components/evaluation/harness.py): on each task's headline
    metric the tuned model may score at most this many points (0..100) below the base model.
    100 (the default) reports the tasks without gating on them."""
    min_reward_gain: float = 0.0
    """objective=grpo: the tuned model's mean reward on the held-out prompts must exceed the
    base model's by at least this (in reward units). 0 disables the check (the loss check, the
    negated mean reward, still asks for "not worse")."""
    judge_min_win_rate: float = 0.0
    """Pairwise judge (components/evaluation/judge.py): the tuned model's win rate against the
    base (ties count half) must be at least this (0..1). 0 disables the check."""

    def validate(self) -> None:
        errors = []
        if not math.isfinite(self.min_loss_improvement):
            errors.append("min_loss_improvement must be a finite number")
        if not 0.0 <= self.min_exact_match <= 1.0:
            errors.append(f"min_exact_match must be in [0, 1], got {self.min_exact_match}")
        if not (math.isfinite(self.champion_tolerance) and self.champion_tolerance >= 0):
            errors.append(f"champion_tolerance must be >= 0, got {self.champion_tolerance}")
        if not 0.0 <= self.min_general_retained <= 1.0:
            errors.append(
                f"min_general_retained must be in [0, 1], got {self.min_general_retained}"
            )
        if not 0.0 <= self.max_task_regression <= 100.0:
            errors.append(
                f"max_task_regression must be in [0, 100] points, got {self.max_task_regression}"
            )
        if not (math.isfinite(self.min_reward_gain) and self.min_reward_gain >= 0):
            errors.append(f"min_reward_gain must be >= 0, got {self.min_reward_gain}")
        if not 0.0 <= self.judge_min_win_rate <= 1.0:
            errors.append(f"judge_min_win_rate must be in [0, 1], got {self.judge_min_win_rate}")
        if errors:
            raise ValueError("invalid gate thresholds: " + "; ".join(errors))


@dataclass
class GateDecision:
    passed: bool
    checks: list[dict[str, Any]] = field(default_factory=list)
    """One entry per check: name, passed, detail (a sentence for the report and logs)."""

    @property
    def failures(self) -> list[str]:
        return [c["detail"] for c in self.checks if not c["passed"]]


def decide(metrics: dict[str, float], thresholds: GateThresholds) -> GateDecision:
    """Apply `thresholds` to the scalar metrics `run_evaluation` computed.

    Keys read: base_eval_loss, tuned_eval_loss, tuned_exact_match, base/tuned_general_correct
    and general_retained (absent when the base answered no probe), base/tuned_task_<task>
    (harness tasks' headline metrics), judge_win_rate, base/tuned_mean_reward (objective=grpo)
    and, when a champion was evaluated,
    champion_eval_loss and champion_exact_match.
    """
    thresholds.validate()
    checks: list[dict[str, Any]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"name": name, "passed": bool(ok), "detail": detail})

    _loss_check(metrics, thresholds, check)
    if thresholds.min_exact_match > 0:
        _exact_match_check(metrics, thresholds, check)
    if thresholds.min_general_retained > 0:
        _general_check(metrics, thresholds, check)
    if thresholds.max_task_regression < 100.0:
        _task_checks(metrics, thresholds.max_task_regression, check)
    if thresholds.min_reward_gain > 0:
        _reward_check(metrics, thresholds, check)
    if thresholds.judge_min_win_rate > 0:
        _judge_check(metrics, thresholds, check)
    if thresholds.compare_to_champion and "champion_eval_loss" in metrics:
        _champion_checks(metrics, thresholds, check)
    return GateDecision(passed=all(c["passed"] for c in checks), checks=checks)


Check = Callable[[str, bool, str], None]
"""Records one check: its name, whether it passed, and the detail shown in the report."""


def _loss_check(metrics: dict[str, float], thresholds: GateThresholds, check: Check) -> None:
    """The tuned model's eval loss is at least `min_loss_improvement` below the base's."""
    base, tuned = metrics["base_eval_loss"], metrics["tuned_eval_loss"]
    improvement = base - tuned
    check(
        "loss_improvement",
        improvement >= thresholds.min_loss_improvement,
        f"eval loss improved by {improvement:.4f} (base {base:.4f} -> tuned {tuned:.4f}); "
        f"required >= {thresholds.min_loss_improvement:.4f}",
    )


def _exact_match_check(metrics: dict[str, float], thresholds: GateThresholds, check: Check) -> None:
    """The tuned model's exact match on the held-out prompts (failed when none were asked)."""
    em = metrics.get("tuned_exact_match")
    if em is None:
        check(
            "exact_match",
            False,
            f"exact match >= {thresholds.min_exact_match:.3f} required but no generation "
            "examples were evaluated (no eval records / held-out file, or max_examples=0)",
        )
    else:
        check(
            "exact_match",
            em >= thresholds.min_exact_match,
            f"exact match {em:.3f}; required >= {thresholds.min_exact_match:.3f}",
        )


def _general_check(metrics: dict[str, float], thresholds: GateThresholds, check: Check) -> None:
    """The forgetting check: the share of the general probes the base answered that the tuned
    model still answers."""
    kept = metrics.get("general_retained")
    required = thresholds.min_general_retained
    if "base_general_correct" not in metrics or "tuned_general_correct" not in metrics:
        check(
            "general_retained",
            False,
            f"general probes retained >= {required:.3f} required but the probes were not "
            "scored (a model's tokenizer has no chat template)",
        )
    elif kept is None:
        check(
            "general_retained",
            True,
            "the base model answered none of the general probes: nothing to retain",
        )
    else:
        check(
            "general_retained",
            kept >= required,
            f"general probes retained {kept:.3f} (base answered "
            f"{metrics['base_general_correct']:.3f}, tuned "
            f"{metrics['tuned_general_correct']:.3f}); required >= {required:.3f}",
        )


def _reward_check(metrics: dict[str, float], thresholds: GateThresholds, check: Check) -> None:
    """objective=grpo: the mean reward on the held-out prompts rose by `min_reward_gain`."""
    base, tuned = metrics.get("base_mean_reward"), metrics.get("tuned_mean_reward")
    required = thresholds.min_reward_gain
    if base is None or tuned is None:
        check(
            "reward_gain",
            False,
            f"mean reward gain >= {required:.4f} required but no rewards were scored "
            "(objective=grpo evaluates a prompts dataset's held-out prompts)",
        )
        return
    check(
        "reward_gain",
        tuned - base >= required,
        f"mean reward {base:.4f} -> {tuned:.4f} (gain {tuned - base:+.4f}; pass rate "
        f"{metrics.get('base_pass_rate', 0):.3f} -> {metrics.get('tuned_pass_rate', 0):.3f}); "
        f"required gain >= {required:.4f}",
    )


def _judge_check(metrics: dict[str, float], thresholds: GateThresholds, check: Check) -> None:
    """The pairwise judge's win rate of the tuned model against the base."""
    rate, required = metrics.get("judge_win_rate"), thresholds.judge_min_win_rate
    check(
        "judge_win_rate",
        rate is not None and rate >= required,
        f"judge win rate {rate:.3f} against the base; required >= {required:.3f}"
        if rate is not None
        else f"judge win rate >= {required:.3f} required but the judge did not run "
        "(judge off, or no held-out prompts)",
    )


def _champion_checks(metrics: dict[str, float], thresholds: GateThresholds, check: Check) -> None:
    """The tuned model against the registered champion: loss, and exact match when both have it,
    each within `champion_tolerance`."""
    tuned, champion = metrics["tuned_eval_loss"], metrics["champion_eval_loss"]
    tol = thresholds.champion_tolerance
    check(
        "champion_loss",
        tuned <= champion + tol,
        f"eval loss {tuned:.4f} vs champion {champion:.4f} (tolerance {tol:.4f})",
    )
    if "champion_exact_match" in metrics and "tuned_exact_match" in metrics:
        em, champion_em = metrics["tuned_exact_match"], metrics["champion_exact_match"]
        check(
            "champion_exact_match",
            em >= champion_em - tol,
            f"exact match {em:.3f} vs champion {champion_em:.3f} (tolerance {tol:.3f})",
        )


TASK_PREFIX = "tuned_task_"
"""Metric keys of the harness tasks' headline metrics (`<role>_task_<task>`, harness.py)."""


def _task_checks(metrics: dict[str, float], max_drop: float, check: Check) -> None:
    """One check per harness task: tuned at most `max_drop` points below base."""
    tasks = [k.removeprefix(TASK_PREFIX) for k in metrics if k.startswith(TASK_PREFIX)]
    if not tasks:
        check(
            "task_regression",
            False,
            f"task regression <= {max_drop:.1f} points required but no harness task was "
            "evaluated (set eval_tasks)",
        )
    for task in tasks:
        base = metrics.get(f"base_task_{task}")
        tuned = metrics[f"{TASK_PREFIX}{task}"]
        if base is None:
            check(f"task_regression:{task}", False, f"{task}: the base model was not scored")
            continue
        drop = 100.0 * (base - tuned)
        check(
            f"task_regression:{task}",
            drop <= max_drop,
            f"{task}: {100 * base:.1f} -> {100 * tuned:.1f} ({100 * (tuned - base):+.1f} points); "
            f"allowed drop <= {max_drop:.1f}",
        )
