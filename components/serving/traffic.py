"""A Vertex endpoint's traffic split: the percentages per deployed model, always adding up to 100.
Pure arithmetic (largest remainders first, ties by id), so the deploy, its rollback and a failed
run's cleanup give the earlier models the same shares."""

from __future__ import annotations


def rescaled(split: dict[str, int], to: int = 100) -> dict[str, int]:
    """`split` scaled to add up to `to` (largest remainders first, ties by id)."""
    total = sum(split.values())
    exact = {k: v * to / total for k, v in split.items()}
    out = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[: to - sum(out.values())]:
        out[k] += 1
    return out


def challenger_split(current: dict[str, int], share: int) -> dict[str, int]:
    """The traffic split with the new model ("0", as DeployModel names it) at `share` percent and
    the current models keeping the rest in their proportions (largest remainders first)."""
    serving = {k: v for k, v in current.items() if v > 0}
    if not serving or share >= 100:
        return {"0": 100}
    return {**rescaled(serving, 100 - share), "0": share}
