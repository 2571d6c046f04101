"""Cancellation reaches the step: KFP runs a lightweight component as `sh -ec '...; python3 -m
kfp.dsl.executor_main ...'`, and dash does not forward SIGTERM to that child. Our components exec
Python instead (components/lightweight.py: exec_python). Both commands are run here for real,
under a real `sh`, and sent SIGTERM the way the kubelet signals a container's PID 1.

No `from __future__ import annotations` here: KFP reads the component's annotations as types."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kfp import dsl

from components.lightweight import exec_python, llmft_component


def wait_for_term(marker_dir: str) -> None:
    """A step that records SIGTERM (as the launchers do when they cancel) and then exits."""
    import os
    import signal
    import sys
    from pathlib import Path

    def on_term(signum, frame):  # type: ignore[no-untyped-def]
        Path(marker_dir, "got-sigterm").write_text("cancelled")
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    Path(marker_dir, "ready").write_text(str(os.getpid()))
    while True:
        signal.pause()  # until a signal's handler ran (on_term exits); the test kills it anyway


def _command(component: dsl.base_component.BaseComponent, tmp_path: Path) -> list:
    container = component.component_spec.implementation.container
    executor_input = {
        "inputs": {"parameterValues": {"marker_dir": str(tmp_path)}},
        "outputs": {"outputFile": str(tmp_path / "output.json")},
    }
    args = [json.dumps(executor_input) if a == "{{$}}" else a for a in container.args]
    return [*container.command, *args]


def _start(command: list, tmp_path: Path) -> tuple:
    # `python3` must be this environment's, as it is the image's in a task container.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    proc = subprocess.Popen(command, env={**os.environ, "TMPDIR": str(tmp_path), "PATH": path})
    ready = tmp_path / "ready"
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text():  # the step says when it is up
        assert proc.poll() is None and time.monotonic() < deadline, "the step did not start"
        time.sleep(0.05)
    return proc, int(ready.read_text())


@pytest.mark.slow
def test_sigterm_to_the_task_container_reaches_the_component(tmp_path: Path) -> None:
    component = llmft_component(wait_for_term)
    assert component.component_spec.implementation.container.command[0] == "sh"
    proc, step_pid = _start(_command(component, tmp_path), tmp_path)
    assert step_pid == proc.pid, "Python replaced the shell (exec)"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert (tmp_path / "got-sigterm").read_text() == "cancelled"


@pytest.mark.slow
def test_without_exec_sh_leaves_the_component_deaf_to_sigterm(tmp_path: Path) -> None:
    """The control: KFP's own command. sh dies of the signal; the step never hears it."""
    component = dsl.component(wait_for_term, base_image="python:3.11", install_kfp_package=False)
    proc, step_pid = _start(_command(component, tmp_path), tmp_path)
    try:
        assert step_pid != proc.pid
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        os.kill(step_pid, 0)  # still running, orphaned
        assert not (tmp_path / "got-sigterm").exists()
    finally:
        os.kill(step_pid, signal.SIGKILL)


def test_exec_python_refuses_a_command_it_does_not_know() -> None:
    with pytest.raises(AssertionError, match="update exec_python"):
        exec_python(["sh", "-c", "python3 main.py"])
