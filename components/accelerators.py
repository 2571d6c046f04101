"""Accelerator names: Vertex AI's enum names and GKE's node labels differ; one table maps them.

Used where parameters are checked (components/run_params.py) and where the PyTorchJob's node
selector is built (components/launchers/pytorchjob.py).
"""

from __future__ import annotations

GKE_ACCELERATORS = {
    "NVIDIA_H200_141GB": "nvidia-h200-141gb",
    "NVIDIA_H100_MEGA_80GB": "nvidia-h100-mega-80gb",
    "NVIDIA_H100_80GB": "nvidia-h100-80gb",
    "NVIDIA_A100_80GB": "nvidia-a100-80gb",
    "NVIDIA_TESLA_A100": "nvidia-tesla-a100",
    "NVIDIA_L4": "nvidia-l4",
    "NVIDIA_TESLA_T4": "nvidia-tesla-t4",
    "NVIDIA_TESLA_V100": "nvidia-tesla-v100",
}
"""Vertex accelerator names -> GKE's `cloud.google.com/gke-accelerator` values (they differ)."""


def gke_accelerator(name: str) -> str | None:
    """GKE accelerator label for a Vertex-style or GKE-style name; None/"" means CPU only."""
    if not name:
        return None
    return GKE_ACCELERATORS.get(name, name if name == name.lower() else None) or _unknown(name)


def _unknown(name: str) -> str:
    raise ValueError(
        f"accelerator {name!r}: use a GKE accelerator label (e.g. nvidia-h100-80gb) or one of "
        f"{', '.join(GKE_ACCELERATORS)}"
    )
