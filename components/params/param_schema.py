"""The machinery of a parameter schema, apart from any one schema: a field's one default,
description and rules (`param`), checked (`field_error`) and coerced from loose values (`coerce`).
components/params/run_params.py declares the run parameters with it.
"""

from __future__ import annotations

import json
import math
import operator
import re
import typing
from collections.abc import Callable
from dataclasses import Field, field
from typing import Any, Literal


def param(
    default: Any,
    help: str,
    *,
    required: bool = False,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    pattern: tuple[str, str] | None = None,
    steps: tuple[str, ...] = (),
    cloud: bool = False,
) -> Any:
    """A `RunParams` field: its one default, its description and its per-field rules.

    Args:
        default: the default (dicts are copied per instance).
        help: the description shown by the console, `llmft run --help` and the docs.
        required: an empty value is an error (the default "" then means "must be given").
        ge, gt, le, lt: numeric bounds.
        pattern: (regex, what it must look like); checked on non-empty strings.
        steps: the pipeline steps that take it (their component names, besides validate_inputs,
            which takes every parameter): each becomes an input of those steps' components and
            is wired from the pipeline's parameter (components/params/step_params.py).
        cloud: it means something only on Google Cloud (a project, a machine, a registry...):
            a local run lists it in its log, not on the terminal.
    """
    rules = {"help": " ".join(help.split()), "required": required, "pattern": pattern}
    rules |= {"steps": steps, "cloud": cloud}
    rules |= {"ge": ge, "gt": gt, "le": le, "lt": lt}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=rules)
    return field(default=default, metadata=rules)


def literal_choices(hint: Any) -> tuple[str, ...]:
    """The allowed values of a `Literal` annotation (empty for free-form ones)."""
    return tuple(typing.get_args(hint)) if typing.get_origin(hint) is Literal else ()


def field_error(f: Field[Any], value: Any, options: tuple[str, ...]) -> str | None:
    """The problem with one field's value by its own rules (choices, required, bounds,
    pattern), or None."""
    rules = {"required": False, "pattern": None, **dict.fromkeys(_BOUNDS), **f.metadata}
    if options and value not in options:
        return f"{f.name}={value!r}: choose one of {', '.join(options)}"
    if rules["required"] and not str(value).strip():
        return f"{f.name} is empty: {_lower_first(rules['help'])}"
    if isinstance(value, float) and not math.isfinite(value):
        # inf passes every bound a positive setting has (`> 0`), NaN fails them all with a
        # confusing message: neither is a setting (1e999 reads as inf; YAML has .inf and .nan).
        return f"{f.name}={value}: use a finite number"
    if isinstance(value, int | float) and not isinstance(value, bool):
        bounds = [(*_BOUNDS[key], rules[key]) for key in _BOUNDS if rules[key] is not None]
        if not all(holds(value, bound) for _, holds, bound in bounds):
            wanted = " and ".join(f"{op} {bound}" for op, _, bound in bounds)
            return f"{f.name}={value}: use a value {wanted}"
    if rules["pattern"] and isinstance(value, str) and value:
        regex, what = rules["pattern"]
        if re.fullmatch(regex, value) is None:
            return f"{f.name}={value!r} is not {what}"
    return None


_BOUNDS: dict[str, tuple[str, Callable[[Any, Any], bool]]] = {
    "ge": (">=", operator.ge),
    "gt": (">", operator.gt),
    "le": ("<=", operator.le),
    "lt": ("<", operator.lt),
}


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def coerce(value: Any, hint: Any) -> tuple[Any, str]:
    """(value as the annotation's type, "") or (None, what is wrong)."""
    origin = typing.get_origin(hint) or hint
    if origin is Literal:
        return (value, "") if isinstance(value, str) else (None, "must be a string")
    if origin is bool:
        return (value, "") if isinstance(value, bool) else (None, "must be true or false")
    if origin is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return (value, "") if ok else (None, "must be an integer")
    if origin is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return (float(value), "") if ok else (None, "must be a number")
    if origin is dict:
        return (dict(value), "") if isinstance(value, dict) else (None, "must be a mapping")
    if origin is str:
        if isinstance(value, list):
            # A YAML/JSON list where text is expected: its JSON text (the JSON-list parameters,
            # such as rewards, given in a config file or `--param rewards=[...]`).
            return json.dumps(value), ""
        return (value, "") if isinstance(value, str) else (None, "must be a string")
    raise AssertionError(f"no coercion for {hint}")  # a new field type needs a line here
