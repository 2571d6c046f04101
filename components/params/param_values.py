"""Run parameters from loose values: a config file's `parameters:`, `--param KEY=VALUE` flags, a
template's values. Each value is coerced to its field's type (components/params/run_params.py); unknown
names and wrong types are reported together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from difflib import get_close_matches
from typing import Any

from components.params.param_schema import coerce, field_error
from components.params.run_checks import raise_errors
from components.params.run_params import RunParams, choices, fields, type_hints


def params_from_mapping(values: Mapping[str, Any], *, base: RunParams | None = None) -> RunParams:
    """`RunParams` from a mapping (config file, `--param`s, a template's values) over `base`.

    Unknown names and values of the wrong type are reported together (one ValueError); the
    cross-field rules are `RunParams.errors()`'s job.
    """
    known = fields()
    hints = type_hints()
    errors = []
    unknown = sorted(set(values) - set(known))
    if unknown:
        guesses = [
            f"{name} (did you mean {close[0]}?)" if (close := get_close_matches(name, known, 1))
            else name
            for name in unknown
        ]  # fmt: skip
        errors.append(f"unknown parameter(s) {', '.join(guesses)}: valid are {', '.join(known)}")
    coerced = {}
    for name in known.keys() & values.keys():
        value, problem = coerce(values[name], hints[name])
        if problem:
            errors.append(f"{name}={values[name]!r}: {problem}")
        else:
            coerced[name] = value
    raise_errors(errors)
    return dataclasses.replace(base or RunParams(), **coerced)


def field_errors(values: Mapping[str, Any]) -> list[str]:
    """Type and single-field problems of the given values, names the schema does not know aside:
    what can be checked of a partial set (e.g. `--param`s for a template not yet fetched)."""
    known, hints, errors = fields(), type_hints(), []
    for name in known.keys() & values.keys():
        value, problem = coerce(values[name], hints[name])
        error = f"{name}={values[name]!r}: {problem}" if problem else None
        if not problem and not known[name].metadata["required"]:
            error = field_error(known[name], value, choices(name))
        if error:
            errors.append(error)
    return errors
