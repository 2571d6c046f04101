"""Reviewed golden files: what a builder returns or a fake receives must equal one exactly.

`golden.check("name.json", data)` (the `golden` fixture, tests/conftest.py) compares `data` with
tests/golden/name.json as JSON. With `pytest --update-goldens` (or LLMFT_UPDATE_GOLDENS=1) it
rewrites the file from `data` instead, in one canonical form (sorted keys, 2-space indent), so a
change shows as a readable diff to review against the schema or service docs before committing
(tests/golden/README.md). The expectations are files, never built by the code under test.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_ENV = "LLMFT_UPDATE_GOLDENS"


RBAC_PERMISSIONS = "rbac_permissions.json"
"""The (apiGroup, resource, verb) triples the Kubernetes fakes were asked for (tests/fakes/k8s_api.py),
written from a whole run in update mode."""


RBAC_SOURCES = (
    "test_launcher_gke.py",
    "test_launcher_trainjob.py",
    "test_rendezvous_kubernetes.py",
    "test_rendezvous_local_etcd.py",
)
"""The test modules whose Kubernetes fakes see every request our code makes (launcher, etcd,
cleanup): the RBAC golden is rewritten, and checked for stale entries, only when all of them ran."""


def rbac_permissions() -> set[tuple[str, str, str]]:
    """The reviewed permissions our code needs, from tests/golden/rbac_permissions.json."""
    return {tuple(p) for p in json.loads((GOLDEN_DIR / RBAC_PERMISSIONS).read_text())}  # type: ignore[misc]


def without_timestamp(name: str) -> str:
    """A generated run name or job id with its creation time (`-YYYYMMDD-HHMMSS` or
    `-YYYYMMDDHHMMSS`) replaced, so that a golden file can hold it."""
    return re.sub(r"-\d{8}-?\d{6}$", "-<timestamp>", name)


def canonical(data: Any) -> str:
    """The one text form of a golden file."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


class Golden:
    """Compares with, or (in update mode) rewrites, files under tests/golden/."""

    def __init__(self, update: bool = False) -> None:
        self.update = update or os.environ.get(UPDATE_ENV) == "1"

    def check(self, name: str, data: Any) -> None:
        path = GOLDEN_DIR / name
        text = canonical(data)
        if self.update:
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            return
        assert path.exists(), f"no golden file {path}: run `pytest --update-goldens` and review it"
        # Parsed first for pytest's structural diff, then the text, so files stay canonical.
        assert json.loads(text) == json.loads(path.read_text()), f"differs from {path}"
        assert text == path.read_text(), f"{path} is not canonical: rerun with --update-goldens"
