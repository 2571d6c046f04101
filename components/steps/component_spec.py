"""How a step declares its KFP component: the one specification the component is generated from.

A step module (components/steps/<step>.py) holds
- `<Step>Request`: a frozen dataclass whose `params` field is the run parameters the step takes
  (its class in components/params/by_step.py, generated from the `RunParams` fields that name the
  step in `steps=(...)`; components/params/step_params.py) and
  whose other fields marked with `component_input` are the component's own inputs and outputs
  (run id, upstream artifacts, output paths) with their KFP annotation; unmarked fields with
  defaults are for callers in Python (tests, `llmft` commands) and never reach the component;
- `COMPONENT`: a `StepComponent` naming the component, its request, its outputs and the
  docstring the Vertex AI / KFP console shows.
pipelines/component_source.py writes components/kfp_components.py from them (`llmft compile`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

KFP = "kfp"
"""The metadata key holding a component input's KFP annotation (source text)."""


KFP_DEFAULT = "kfp_default"
"""The metadata key saying the component keeps the field's default (an optional input)."""


def component_input(annotation: str, *, optional: bool = False, **field_options: Any) -> Any:
    """A request field that is also a component input or output, declared as `annotation` (KFP
    source text such as "str", "Input[Model]", "OutputPath(str)"). `optional`: the component
    input takes the field's default too (otherwise the default serves Python callers only)."""
    metadata = {KFP: annotation, KFP_DEFAULT: optional}
    return dataclasses.field(metadata=metadata, **field_options)


@dataclass(frozen=True)
class StepComponent:
    """One pipeline step's KFP component."""

    name: str
    """The component's name (and the generated function's)."""
    request: type
    """The step's request dataclass (its `params` and `component_input` fields)."""
    doc: str
    """The component's docstring: summary, then `Returns:` for its outputs."""
    returns: tuple[tuple[str, str], ...] | str | None = None
    """Named outputs as (name, type) pairs, one unnamed return type, or None."""


def own_inputs(request: type) -> list[dataclasses.Field[Any]]:
    """The request's component inputs and outputs besides the run parameters, in order."""
    return [f for f in dataclasses.fields(request) if KFP in f.metadata]
