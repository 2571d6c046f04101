"""Training launchers: local torchrun agents, a PyTorchJob on GKE, a Vertex AI CustomJob.

`base` is the one interface; `local`, `gke` and `vertex` implement it, each with its own typed
options; `pytorchjob` and `customjob` build the cloud jobs' specs. The train step
(components/steps/train.py) gets its launcher from the options (`options.launcher()`).
"""

from components.launchers.base import (
    LaunchCancelled,
    Launcher,
    LaunchFailed,
    LaunchResult,
    TrainLaunch,
)

__all__ = [
    "LaunchCancelled",
    "LaunchFailed",
    "LaunchResult",
    "Launcher",
    "TrainLaunch",
]
