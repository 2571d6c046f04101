"""The unit tier's rule, enforced: a unit test runs in one process. It starts no process (no
subprocess, no fork, no multiprocessing, no asyncio subprocess, so no torchrun, kfp.local or
`llmft` child), runs no Beam pipeline, forms no torch process group, and binds or listens on no
socket (so no server of its own, not even a loopback fake). A unit-marked test that does fails with
"unit tests run in one process: <what was started>; mark it integration".

How (tests/conftest.py wires it): the functions that start those things are wrapped once per
session (`install`); each wrapper reports to `started`, which does nothing unless a unit test is
running. While a unit test's fixtures are set up, what they start is recorded and the test fails
once they are set up (raising inside a session fixture would cache the error for every later test
that uses it); while the test itself runs, the wrapper raises at once (pytest's `Failed`, a
BaseException, so no `except Exception` in the code under test hides it), and the test fails at
teardown too if something swallowed even that. A fixture that started something when an
integration test set it up is remembered, so a unit test that uses it (a server already running)
fails whichever test set it up first.

Why wrappers rather than a seccomp-style sandbox: they name what was started, in the failure,
and cost nothing outside a unit test. What they cannot see: a C extension that forks or binds
by itself (not one of ours; torch's TCPStore and process groups are wrapped by name).
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing.process
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

import pytest

MESSAGE = "unit tests run in one process: {what}; mark it integration"


class _State:
    unit_test: str | None = None  # nodeid of the unit test running now
    phase: str = ""  # "setup", "call" or "teardown"
    fixture: str | None = None  # the fixture being set up now (any tier)
    seen: ClassVar[list[str]] = []  # what the running unit test started
    by_fixture: ClassVar[dict[str, str]] = {}  # fixture definition -> what it first started


def started(what: str) -> None:
    """Called by every wrapper before the real function runs."""
    if _State.fixture is not None:
        _State.by_fixture.setdefault(_State.fixture, what)
    if _State.unit_test is None:
        return
    where = _State.fixture.rsplit("::", 1)[-1] if _State.fixture else None
    _State.seen.append(what if where is None else f"{what}, in fixture {where!r}")
    if _State.phase == "call":
        pytest.fail(MESSAGE.format(what=what), pytrace=False)


def _wrap(owner: Any, name: str, describe: Callable[..., str]) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_unit_guard", False):
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started(describe(*args, **kwargs))
        return original(*args, **kwargs)

    wrapper._unit_guard = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)


def _command(args: Any) -> str:
    if isinstance(args, str | bytes | os.PathLike):
        return str(args)[:80]
    parts = [os.path.basename(str(a)) if i == 0 else str(a) for i, a in enumerate(args)]
    return " ".join(parts[:4]) + (" ..." if len(parts) > 4 else "")


def install() -> None:
    """Wrap what starts a process or binds a socket (the standard library's, once per session)."""
    # urllib3 probes for IPv6 at import by binding ('::1', 0): a probe, not a server; import it
    # before the wrappers exist so that a unit test that first imports it is not blamed.
    import urllib3.util.connection  # noqa: F401

    _wrap(
        subprocess.Popen,
        "__init__",
        lambda self, args, *a, **k: f"a subprocess ({_command(args)})",
    )
    for name in ("fork", "forkpty"):
        _wrap(os, name, lambda *a, _n=name, **k: f"a forked process (os.{_n})")
    for name in ("posix_spawn", "posix_spawnp", "system"):
        _wrap(os, name, lambda path, *a, _n=name, **k: f"a process (os.{_n} {_command([path])})")
    _wrap(
        multiprocessing.process.BaseProcess,
        "start",
        lambda self: f"a multiprocessing process ({self.name})",
    )
    _wrap(socket.socket, "bind", lambda self, address: f"a socket bound to {address!r}")
    _wrap(socket.socket, "listen", lambda self, *a: "a listening socket (a server)")
    install_lazy()


def install_lazy() -> None:
    """Wrap what lives in heavy modules only once a test imported them (Beam, torch.distributed):
    importing them here would cost every run their import time."""
    beam = sys.modules.get("apache_beam.pipeline")
    if beam is not None:
        _wrap(beam.Pipeline, "run", lambda self, *a, **k: "a Beam pipeline run")
    dist = sys.modules.get("torch.distributed")
    if dist is not None and hasattr(dist, "init_process_group"):
        _wrap(dist, "init_process_group", lambda *a, **k: "a torch process group")
        _wrap(dist, "TCPStore", lambda *a, **k: "a torch TCPStore (a server)")


def begin(nodeid: str, fixtures: Iterable[str]) -> None:
    """A unit test starts: watch it (setup, call, teardown). `fixtures`: the definitions it uses,
    "<where defined>::<name>" (tests/conftest.py `_fixture_key`)."""
    install_lazy()
    _State.unit_test, _State.phase, _State.seen = nodeid, "setup", []
    for name in fixtures:
        if name in _State.by_fixture:
            where = name.rsplit("::", 1)[-1]
            _State.seen.append(f"{_State.by_fixture[name]}, through fixture {where!r}")


def phase(name: str) -> None:
    _State.phase = name


def end() -> None:
    _State.unit_test, _State.phase = None, ""


def failure() -> str | None:
    """The message a unit test fails with, or None when it started nothing."""
    if not _State.seen:
        return None
    return MESSAGE.format(what="; ".join(dict.fromkeys(_State.seen)))


@contextlib.contextmanager
def fixture_setup(name: str) -> Iterator[None]:
    """A fixture (of any test) is being set up: remember what it starts."""
    outer, _State.fixture = _State.fixture, name
    try:
        yield
    finally:
        _State.fixture = outer


def seen_count() -> int:
    return len(_State.seen)
