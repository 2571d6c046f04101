"""Kubernetes manifests as YAML for `kubectl apply -f` (`llmft render pytorchjob|trainjob`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """YAML for `kubectl apply -f`: no anchors, and strings that YAML 1.2 (kubectl) would read as
    numbers (`2e-05`, `1000` in a command) are quoted so they stay strings."""
    import yaml

    number = re.compile(
        r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|0x[0-9a-fA-F]+|0o[0-7]+"
    )

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    def represent_str(dumper: yaml.SafeDumper, value: str) -> Any:
        style = "'" if number.fullmatch(value) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, represent_str)
    return str(yaml.dump(dict(manifest), Dumper=Dumper, sort_keys=False))
