"""The divergence guard: a run whose loss climbs far above what it had reached is stopped.

A learning rate typed ten thousand times too large does not always give NaN: the tiny model at
lr=30 went from loss 8.2 to 54,055 in one step and on to 104,205, all finite, and used to be
exported as a success. The rule, checked after every optimizer step on the all-reduced loss (so
every rank decides the same):

    mean(loss of the last WINDOW steps) > divergence_factor x BEST  and  > BEST + MARGIN_NATS

where BEST is the lowest such window mean of an earlier step of this run (of this start: a resumed
run judges itself from its resume on). The window smooths the noise of single batches; the ratio
makes the rule independent of the loss's scale; the margin in nats keeps a run whose loss is near
0 (a small dataset learnt by heart) from stopping on a rise from 0.01 to 0.05. `divergence_factor`
= 0 turns the guard off (trainer/config.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 5
"""Steps averaged before a loss is compared (fewer at the start of a run)."""
MARGIN_NATS = 1.0
"""How far (in nats per loss unit) the window mean must also be above the best one."""


class DivergedError(RuntimeError):
    """The loss diverged (finite, but far above the best it reached); nothing was saved after."""


@dataclass
class DivergenceGuard:
    factor: float
    """`divergence_factor`: 0 disables the guard."""
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    best: float | None = None
    best_step: int = 0

    def check(self, step: int, loss: float) -> str | None:
        """Record step `step`'s loss; the reason to stop (without the advice), or None."""
        if not self.factor:
            return None
        self.recent.append(loss)
        mean = sum(self.recent) / len(self.recent)
        best = self.best
        if best is not None and mean > self.factor * best and mean > best + MARGIN_NATS:
            return (
                f"step {step}: loss={loss:.6g} diverged: the mean of the last {len(self.recent)} "
                f"steps ({mean:.6g}) is over {self.factor:g}x the lowest earlier mean ({best:.6g}, "
                f"step {self.best_step})"
            )
        if best is None or mean < best:
            self.best, self.best_step = mean, step
        return None
