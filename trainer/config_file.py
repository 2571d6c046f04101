"""The one reader of YAML settings files, and the coercion of flag text to a field's type.

Every `--config FILE.yaml` goes through `read_yaml_mapping`: the trainer's (trainer/config.py),
`llmft run|schedule|upload` (pipelines/deploy/config.py) and the local run's parameters
(pipelines/local_run.py). It lives here, in the lowest layer that reads such a file, so that every
layer above imports it instead of keeping its own copy. No torch, no Beam.
"""

from __future__ import annotations

import json
import os
import types
import typing
from typing import Any

from trainer import storage


def read_yaml_mapping(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The top-level mapping of a YAML file (local, `file://` or gs://); an empty file is {}.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: it is not valid YAML, or not a mapping at the top level.
    """
    import yaml

    name = str(path)
    try:
        with storage.open(name, "r") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {name!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"config file {name!r} is a directory: give a YAML file") from None
    except yaml.YAMLError as exc:
        flat = " ".join(str(exc).split())
        raise ValueError(f"config file {name!r} is not valid YAML: {flat}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {name!r} must hold a mapping of key: value")
    return data


def coerce_field(name: str, raw: Any, annotation: Any) -> Any:
    """Turn a YAML value or a command-line string into the field's type, or raise ValueError.

    Lenient on purpose: flags arrive as text (`--compile true`, `--max-steps 10`, `--a x,y`).
    """
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null", "")):
            return None
        (annotation,) = [a for a in args if a is not type(None)]
        origin = typing.get_origin(annotation)
    if origin is list:
        if isinstance(raw, str):
            raw = json.loads(raw) if raw.strip().startswith("[") else raw.split(",")
        if not isinstance(raw, list):
            raise ValueError(f"{name} must be a list (got {raw!r})")
        return [str(item).strip() for item in raw]
    if annotation is bool:
        return _coerce_bool(name, raw)
    if annotation is int:
        return _coerce_int(name, raw)
    if annotation is float:
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number (got {raw!r})") from None
    return str(raw)


def _coerce_bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(raw, str) and raw.lower() in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false (got {raw!r})")


def _coerce_int(name: str, raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError(f"{name} must be an integer (got {raw!r})")
    try:
        value = float(raw) if isinstance(raw, str) else raw
        if not isinstance(value, int | float) or int(value) != value:
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer (got {raw!r})") from None
