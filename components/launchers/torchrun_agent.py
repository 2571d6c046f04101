"""`python -m components.launchers.torchrun_agent ARGS`: torchrun's agent (`torch.distributed.run
ARGS`) that never hangs on its way out; what the local launcher starts on each node.

When a local run's launcher dies (even by SIGKILL), its agents get SIGTERM (components.runtime.lifeline)
and torch's agent stops its workers. But with `--tee` its log-tailing threads are not always told
to stop on that path, and the interpreter's exit then waits for them forever: agents were found
alive minutes later with the main thread in `concurrent.futures.thread._python_exit`, joining
`TailLog` threads (tests/faults/test_orphans.py failed that way 2 runs in 3 on a quiet machine).
It happens when the launcher is gone: torch's shutdown logs to a pipe whose reader died, the write
raises, and the rest of its cleanup (its workers' SIGTERM too) is skipped. So the agent's output
goes through a pipe it reads itself (`_relay_output`), and the agent ends the moment torchrun's
`main` returns or raises, with torchrun's exit status and its traceback printed as Python would
(the launcher keeps that out of the terminal).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import traceback


def _relay_output() -> threading.Thread:
    """Point fds 1 and 2 at a pipe this process reads itself and copies to where they pointed, so
    no write of torch's ever fails when the launcher (the reader of the original pipe) is gone:
    such a failed write skipped the rest of torch's shutdown, its workers' SIGTERM included."""
    out = os.dup(1)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)

    def copy() -> None:
        while chunk := os.read(read_end, 1 << 16):
            with contextlib.suppress(OSError):
                os.write(out, chunk)

    thread = threading.Thread(target=copy, name="agent-output", daemon=True)
    thread.start()
    return thread


def main() -> None:
    from torch.distributed.run import main as torchrun_main

    relay = _relay_output()
    code = 1
    try:
        torchrun_main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # torchrun's SignalException, ChildFailedError, or any other
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os.close(1)
            os.close(2)  # the relay reads to the end, then stops
            relay.join(timeout=5)
        os._exit(code)  # not the interpreter's exit, which would join threads that may never end


if __name__ == "__main__":
    main()
