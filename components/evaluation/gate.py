"""The quality gate: does the fine-tuned model deserve to be registered?

Every check is against a threshold the user sets; a check whose metric was not computed fails
rather than passing silently (a gate that asks for exact match must see generation results).
"""

from __future__ import annotations

import math
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
    and general_retained (absent when the base answered no probe) and, when a champion was
    evaluated, champion_eval_loss and champion_exact_match.
    """
    thresholds.validate()
    checks: list[dict[str, Any]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"name": name, "passed": bool(ok), "detail": detail})

    base, tuned = metrics["base_eval_loss"], metrics["tuned_eval_loss"]
    improvement = base - tuned
    check(
        "loss_improvement",
        improvement >= thresholds.min_loss_improvement,
        f"eval loss improved by {improvement:.4f} (base {base:.4f} -> tuned {tuned:.4f}); "
        f"required >= {thresholds.min_loss_improvement:.4f}",
    )
    if thresholds.min_exact_match > 0:
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
    if thresholds.min_general_retained > 0:
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
    if thresholds.compare_to_champion and "champion_eval_loss" in metrics:
        champion = metrics["champion_eval_loss"]
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
    return GateDecision(passed=all(c["passed"] for c in checks), checks=checks)
