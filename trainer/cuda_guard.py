"""The guard against training or evaluating on CPU while GPUs are billed.

A launcher that gives a step GPUs (a PyTorchJob or CustomJob with accelerators, the pipeline's
evaluate task with an accelerator) sets `LLMFT_EXPECT_CUDA=1` in its environment. When torch then
sees no CUDA (on GKE: the driver mount missing from the loader path, see
`components.platform.platform_facts.GKE_NVIDIA_LIBRARY_PATH`), the
step stops at once with this module's error instead of silently running on CPU with gloo or in
fp32 for hours (issue 29, N1). Plain module, no torch import: the caller passes what it sees.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

EXPECT_CUDA_ENV = "LLMFT_EXPECT_CUDA"
"""Set to "1" by the launchers when the step was given GPUs."""


def expects_cuda(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher that started this process gave it GPUs."""
    return (os.environ if environ is None else environ).get(EXPECT_CUDA_ENV, "") == "1"


def expect_cuda_env(gpus: int) -> dict[str, str]:
    """The environment a launcher sets for a step given `gpus` GPUs ({} for none)."""
    return {EXPECT_CUDA_ENV: "1"} if gpus > 0 else {}


def check_cuda(cuda_available: bool, what: str, environ: Mapping[str, str] | None = None) -> None:
    """Raise when this step was given GPUs but CUDA is unavailable.

    Args:
        cuda_available: `torch.cuda.is_available()`.
        what: the step, for the message ("the trainer", "evaluation").
        environ: the environment to read (default: this process's).

    Raises:
        RuntimeError: GPUs were requested for this step and torch sees none.
    """
    if cuda_available or not expects_cuda(environ):
        return
    library_path = (os.environ if environ is None else environ).get("LD_LIBRARY_PATH", "")
    raise RuntimeError(
        f"{what} was given GPUs ({EXPECT_CUDA_ENV}=1) but torch sees no CUDA device "
        f"(LD_LIBRARY_PATH={library_path!r}): on GKE the driver's lib64 under /usr/local/nvidia "
        "must be on LD_LIBRARY_PATH (the image and the PyTorchJob set it); check the node's GPU "
        "driver and the pod's nvidia.com/gpu limit. Stopping rather than running on CPU while "
        "GPUs are billed."
    )
