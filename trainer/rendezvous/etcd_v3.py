"""The `etcd-v3` torchrun rendezvous backend: its `torchrun.handlers` entry point.

Use it like torch's `etcd-v2` backend, against any etcd >= 3.4 (no `--enable-v2` needed):

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend etcd-v3 \\
        --rdzv-endpoint etcd-0:2379,etcd-1:2379 --rdzv-id "$RUN_ID" \\
        --rdzv-conf cacert=/tls/ca.crt,cert=/tls/client.crt,key=/tls/client.key train.py

pyproject.toml registers `handler_entry_point` under `torchrun.handlers`. torch loads that group
while its own rendezvous package is still initialising, so this module must not import that
package at import time (torch would only log the circular import as a warning and drop the
backend): everything torch-side lives in `etcd_v3_handler` and is imported when a handler is made.
The options live in `etcd_v3_config`, which both import (so the two never import each other).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from trainer.rendezvous.etcd_v3_config import EtcdV3RendezvousConfig

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters


def create_rdzv_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Build the `etcd-v3` handler from torchrun's parameters (the registry's creator)."""
    # torch.distributed.elastic: torchrun imports this plugin module in every agent, but builds
    # the handler (and needs its imports) only when --rdzv-backend=etcd-v3
    from trainer.rendezvous.etcd_v3_handler import create_handler

    return create_handler(EtcdV3RendezvousConfig.from_params(params), params)


def handler_entry_point() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The `torchrun.handlers` entry point: returns the creator torch registers as `etcd-v3`."""
    return create_rdzv_handler
