"""The unit tier's guard (tests/unit_guard.py) stops what a unit test must not start, before it
starts, and names it. These tests are unit tests themselves, so the guard they check is the one
watching them: each catches the guard's failure and then forgets what it recorded (else the test
would fail for having started something, which is the guard working)."""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import unit_guard


@pytest.fixture
def caught() -> Callable[[Callable[[], object]], str]:
    """Run `start`; return the guard's failure message (the test fails if there was none)."""

    def catch(start: Callable[[], object]) -> str:
        with pytest.raises(pytest.fail.Exception) as info:
            start()
        unit_guard._State.seen.clear()
        return str(info.value)

    return catch


def test_a_subprocess_is_refused_before_it_starts(caught, tmp_path: Path) -> None:
    made = tmp_path / "made"
    message = caught(lambda: subprocess.run(["touch", str(made)], check=True))
    assert message == (
        f"unit tests run in one process: a subprocess (touch {made}); mark it integration"
    )
    assert not made.exists()


def test_an_asyncio_subprocess_is_refused(caught, tmp_path: Path) -> None:
    made = tmp_path / "made"

    async def start() -> None:
        proc = await asyncio.create_subprocess_exec("touch", str(made))
        await proc.wait()

    assert "a subprocess (touch" in caught(lambda: asyncio.run(start()))
    assert not made.exists()


def test_a_multiprocessing_process_is_refused(caught) -> None:
    process = multiprocessing.get_context("spawn").Process(target=print, name="child")
    assert "a multiprocessing process (child)" in caught(process.start)
    assert process.pid is None


def test_binding_a_socket_is_refused(caught) -> None:
    with socket.socket() as sock:
        message = caught(lambda: sock.bind(("127.0.0.1", 0)))
        assert "a socket bound to ('127.0.0.1', 0)" in message
        assert sock.getsockname() == ("0.0.0.0", 0)  # never bound


def test_a_fixture_that_started_a_server_for_another_test_fails_a_unit_test_using_it() -> None:
    """Whichever test set the fixture up first: what it started is remembered by name."""
    state = unit_guard._State
    saved = (state.unit_test, state.phase, list(state.seen))
    try:
        state.unit_test = None  # as if an integration test were setting the fixture up
        with unit_guard.fixture_setup("loopback_server"):
            unit_guard.started("a listening socket (a server)")
        unit_guard.begin("tests/test_x.py::test_y", ["tmp_path", "loopback_server"])
        assert unit_guard.failure() == (
            "unit tests run in one process: a listening socket (a server), through fixture "
            "'loopback_server'; mark it integration"
        )
    finally:
        state.by_fixture.pop("loopback_server", None)
        state.unit_test, state.phase, state.seen = saved
