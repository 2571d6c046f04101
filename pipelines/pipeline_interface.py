"""The `fine_tune` pipeline function's KFP interface, derived from the run parameters' schema
(components/params/run_params.py): its signature (each parameter's KFP type and the target's default) and
its docstring, whose `Args:` the Vertex AI / KFP console shows as the parameter descriptions.
"""

from __future__ import annotations

import inspect
import typing
from typing import Literal

from components.params.run_params import defaults, describe, fields, type_hints


def kfp_type(name: str) -> type:
    """The plain type KFP declares for a parameter (a `Literal` of strings is a str)."""
    hint = type_hints()[name]
    if typing.get_origin(hint) is Literal:
        return str
    return typing.get_origin(hint) or hint  # type: ignore[no-any-return]


def pipeline_signature(target: str = "local") -> inspect.Signature:
    """The `fine_tune` pipeline function's signature for a target: every parameter with its KFP
    type and the target's default (KFP compiles the pipeline interface from it)."""
    params = [
        inspect.Parameter(
            name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=default,
            annotation=kfp_type(name),
        )
        for name, default in defaults(target).items()
    ]
    return inspect.Signature(params, return_annotation=None)


def pipeline_docstring(summary: str) -> str:
    """Google-style docstring whose `Args:` KFP turns into the console's parameter descriptions."""
    lines = [summary, "", "Args:"]
    lines += [f"    {name}: {describe(name)}" for name in fields()]
    return "\n".join(lines) + "\n"
