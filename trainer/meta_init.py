"""Build a module tree without allocating its parameters (they are filled from a checkpoint).

Its own module because both the model builder (trainer/model.py) and the GGUF conversion
(trainer/gguf.py) use it, and model.py also calls into gguf.py: here it sits below both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Create parameters on the meta device while keeping buffers real.

    Buffers (RoPE inverse frequencies) are computed in `__init__` and are not in checkpoints, so
    they must be real; parameters are overwritten by the checkpoint, so they need no storage yet.
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None:
            meta = module._parameters[name]
            assert meta is not None
            module._parameters[name] = nn.Parameter(
                meta.to("meta"), requires_grad=meta.requires_grad
            )

    nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]
