"""Library messages a user cannot act on, kept off the terminal.

torchao (imported by transformers' quantizers whenever it is installed, so in every process that
loads or saves a model) logs a warning for each optional CUDA kernel library it cannot load on a
CPU machine, and torch's pytree logs a deprecation for torchao's enums. Neither says anything
about the user's run; both are set to ERROR here by every entry point (`llmft`,
`python -m trainer`). Hugging Face progress bars are left to `HF_HUB_DISABLE_PROGRESS_BARS`, which
`llmft run` sets for the steps it runs (their output goes to the run's log file).
"""

from __future__ import annotations

import logging

UNACTIONABLE = ("torchao", "torch.utils._pytree")
"""Loggers whose warnings are about the libraries, not the run."""


def quiet_libraries() -> None:
    """Raise the unactionable libraries' loggers to ERROR (errors still show)."""
    for name in UNACTIONABLE:
        logging.getLogger(name).setLevel(logging.ERROR)
