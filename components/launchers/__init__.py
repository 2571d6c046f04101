"""Training launchers: local torchrun agents, a PyTorchJob on GKE, a Vertex AI CustomJob."""

from components.launchers.base import (
    LaunchCancelled,
    Launcher,
    LaunchFailed,
    LaunchResult,
    TrainLaunch,
    get_launcher,
)

__all__ = [
    "LaunchCancelled",
    "LaunchFailed",
    "LaunchResult",
    "Launcher",
    "TrainLaunch",
    "get_launcher",
]
