"""`python -m trainer`, paused after step PAUSE_AT_STEP until its SIGTERM arrives (preemption test).

Run under torchrun like the trainer, with LLMFT_TEST_PAUSE_AT_STEP=N. After step N's metrics are
written, each rank blocks SIGTERM, writes OUTPUT/paused.rank<RANK> (the test's signal to preempt),
waits for the signal, then hands it to the trainer's own handler. So the test preempts at a known
step whatever the machine's load, instead of racing a running loop.
"""

import os
import signal
import sys
from pathlib import Path

from trainer.__main__ import main
from trainer.metrics import MetricsWriter

PAUSE_AT_STEP = int(os.environ["LLMFT_TEST_PAUSE_AT_STEP"])
_write = MetricsWriter.write


def _write_then_pause(self: MetricsWriter, step: int, values: dict) -> None:
    _write(self, step, values)
    if step != PAUSE_AT_STEP or "loss" not in values:
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    output = Path(sys.argv[sys.argv.index("--output") + 1])
    (output / f"paused.rank{os.environ['RANK']}").touch()
    signal.sigwait({signal.SIGTERM})
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler), "the trainer installs its SIGTERM handler in setup"
    handler(signal.SIGTERM, None)


MetricsWriter.write = _write_then_pause  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
