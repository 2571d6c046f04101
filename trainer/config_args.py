"""The trainer's settings from the command line or a YAML file: `load_config(argv)` (`python -m
trainer`) and `describe_fields()` (each field's docstring, for --help and the docs); a mapping
(a pipeline's overrides) is `trainer.config.config_from_mapping`.

Precedence: TrainConfig's defaults < `--config FILE.yaml` < `--field value` flags; every problem
is reported in one ValueError (trainer/config.py holds the fields and their rules).
"""

from __future__ import annotations

import itertools
from typing import Any

from trainer.config import TrainConfig, field_types
from trainer.config_file import coerce_field, read_yaml_mapping


def _is_bool(annotation: Any) -> bool:
    """A flag that takes the bare form (`--compile`, `--no-compile`)."""
    return annotation in (bool, bool | None)


def load_config(argv: list[str]) -> TrainConfig:
    """Build a validated TrainConfig from `--config-json JSON` (the whole config, as launchers pass
    it) or `[--config FILE.yaml] [--field value ...]` (by hand).

    Flags accept dashes or underscores (`--max-steps 10` == `--max_steps 10`); booleans also take
    the bare form (`--compile`, `--no-compile`).
    """
    if argv[:1] == ["--config-json"]:
        if len(argv) != 2:
            raise ValueError("invalid trainer config: --config-json JSON takes no other arguments")
        return TrainConfig.from_json(argv[1])
    types_by_name = field_types()
    values: dict[str, Any] = {}
    errors: list[str] = []
    flags: list[tuple[str, Any]] = []
    config_file = None
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            errors.append(f"unexpected argument {token!r}: flags look like --field value")
            i += 1
            continue
        key, eq, inline = token[2:].partition("=")
        name = key.replace("-", "_")
        negated = name.startswith("no_") and _is_bool(types_by_name.get(name[3:]))
        if negated:
            flags.append((name[3:], False))
            i += 1
            continue
        if name == "config":
            if eq:
                config_file = inline
                i += 1
            elif i + 1 < len(argv):
                config_file = argv[i + 1]
                i += 2
            else:
                errors.append("--config needs a file")
                i += 1
            continue
        if name not in types_by_name:
            errors.append(f"unknown option --{key}: see docs/trainer.md for the fields")
            i += 1
            continue
        if eq:
            flags.append((name, inline))
            i += 1
        elif _is_bool(types_by_name[name]) and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            flags.append((name, True))
            i += 1
        elif i + 1 < len(argv):
            flags.append((name, argv[i + 1]))
            i += 2
        else:
            errors.append(f"--{key} needs a value")
            i += 1
    if config_file is not None:
        values.update(_read_yaml(config_file, types_by_name, errors))
    values.update(dict(flags))
    kwargs = {}
    for name, raw in values.items():
        try:
            kwargs[name] = coerce_field(name, raw, types_by_name[name])
        except ValueError as exc:
            errors.append(str(exc))
    config = TrainConfig(**kwargs)
    errors.extend(config.errors())
    if errors:
        raise ValueError("invalid trainer config: " + "; ".join(errors))
    return config


def _read_yaml(path: str, types_by_name: dict[str, Any], errors: list[str]) -> dict[str, Any]:
    """The known fields of a `--config` file; problems go to `errors` (reported together)."""
    try:
        data = read_yaml_mapping(path)
    except (FileNotFoundError, ValueError) as exc:
        errors.append(str(exc))
        return {}
    unknown = sorted(set(data) - set(types_by_name))
    if unknown:
        errors.append(f"unknown field(s) in {path}: {', '.join(unknown)}")
    return {k: v for k, v in data.items() if k in types_by_name}


def describe_fields() -> dict[str, str]:
    """Field name -> its docstring, read from this module's source (for docs and --help)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(TrainConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs
