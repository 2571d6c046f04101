"""The train step on this machine: torchrun agents as local processes (`LocalOptions`), and what
such a run checks and holds before it starts (its output writable and locked, its rendezvous
possible).

components/steps/train.py imports this module only for a local run.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from components.launchers.base import TrainLaunch
from components.launchers.local import LocalOptions
from components.preflight.rendezvous_check import check_rendezvous
from trainer import storage
from trainer.packed_data.output_lock import exclusive_output


def local_options() -> LocalOptions:
    """The local backend's options (it takes no run parameters)."""
    return LocalOptions()


def checked_output(launch: TrainLaunch) -> AbstractContextManager[None]:
    """The run's output, held: checked writable and its rendezvous possible first (a run that
    cannot start creates nothing), then one run at a time into it (a second one is refused before
    it reads or deletes anything of the first's; the lock goes with this process, however it
    ends)."""
    if problem := storage.not_writable(launch.trainer.output):
        raise ValueError(f"output {launch.trainer.output!r}: {problem}")
    check_rendezvous(launch.rdzv_backend, launch.rdzv_endpoint)
    return exclusive_output(launch.trainer.output, "llmft train")
