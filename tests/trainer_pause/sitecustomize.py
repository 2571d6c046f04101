"""Test hook: trainer workers pause after a chosen step until their SIGTERM arrives.

Put this directory first on PYTHONPATH and set LLMFT_TEST_PAUSE_AT_STEP=N and
LLMFT_TEST_PAUSE_DIR=DIR (see `pause_env`); Python imports this module at the start of every
process. In trainer workers (torchrun sets RANK) it wraps `MetricsWriter.write`: after step N's
record each rank blocks SIGTERM, writes DIR/paused.rank<RANK> (the test's signal to preempt),
waits for the signal, then hands it to the trainer's own handler. So a test preempts at a known
step whatever the machine's load, instead of racing the training loop.

With LLMFT_TEST_RESUME_FIFO=PATH (a named pipe, `pause_env(..., resume_fifo=PATH)`) the ranks
wait instead until the test opens PATH for writing and closes it, then train on: a test does
something mid-run (tests/test_mlflow_tracking.py stops the tracking server) at a known step.
"""

import os

PAUSE_AT_STEP_ENV, PAUSE_DIR_ENV = "LLMFT_TEST_PAUSE_AT_STEP", "LLMFT_TEST_PAUSE_DIR"
RESUME_FIFO_ENV = "LLMFT_TEST_RESUME_FIFO"


def pause_env(
    step: int, ready_dir: str, base: dict[str, str] | None = None, resume_fifo: str = ""
) -> dict[str, str]:
    """The environment that makes the trainer workers started with it pause after `step`
    (until SIGTERM, or until `resume_fifo` is written to)."""
    base = dict(os.environ if base is None else base)
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))  # the trainer is imported before `-m trainer`
    path = [here, repo, base.get("PYTHONPATH", "")]
    return {
        **base,
        PAUSE_AT_STEP_ENV: str(step),
        PAUSE_DIR_ENV: ready_dir,
        **({RESUME_FIFO_ENV: resume_fifo} if resume_fifo else {}),
        "PYTHONPATH": os.pathsep.join(filter(None, path)),
    }


def _install(step: int, ready_dir: str) -> None:
    import signal
    from pathlib import Path

    from trainer.metrics import MetricsWriter

    write = MetricsWriter.write

    def write_then_pause(self: MetricsWriter, at: int, values: dict) -> None:
        write(self, at, values)
        if at != step or "loss" not in values:
            return
        if fifo := os.environ.get(RESUME_FIFO_ENV):
            Path(ready_dir, f"paused.rank{os.environ['RANK']}").touch()
            with open(fifo) as resume:  # blocks until the test opens it for writing
                resume.read()
            return
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        Path(ready_dir, f"paused.rank{os.environ['RANK']}").touch()
        signal.sigwait({signal.SIGTERM})
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler), "the trainer installs its SIGTERM handler in setup"
        handler(signal.SIGTERM, None)

    MetricsWriter.write = write_then_pause  # type: ignore[method-assign]


if os.environ.get(PAUSE_AT_STEP_ENV) and "RANK" in os.environ:
    _install(int(os.environ[PAUSE_AT_STEP_ENV]), os.environ[PAUSE_DIR_ENV])
