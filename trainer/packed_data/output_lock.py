"""One run at a time into a local output directory: `exclusive_output` holds a kernel lock (flock)
on a file in it while a step writes there, so a second `llmft preprocess` or `llmft train` into
the same directory is refused before it starts (exit 2) instead of both writing the same files.
Remote outputs have no such lock (object stores offer none).

Neutral ground like trainer/storage.py (Beam and the trainer both hold outputs with it): it
imports nothing of this project but storage, and neither apache_beam nor torch.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
from collections.abc import Iterator

from trainer.storage import is_remote, local_path


class OutputBusy(ValueError):
    """Another live process holds the output directory (`exclusive_output`)."""


LOCK_FILE = ".llmft.lock"
"""The lock file `exclusive_output` keeps in a local output directory while a run writes it."""


@contextlib.contextmanager
def exclusive_output(uri: str, command: str) -> Iterator[None]:
    """Hold the local output directory `uri` for one run of `command`: a second run into it at
    the same time raises OutputBusy (a user error: exit 2 before it starts) instead of both
    writing the same files. The lock is the kernel's (flock on `LOCK_FILE`), so a killed run
    never leaves a stale one; the file is removed when the run ends. Remote outputs have no such
    lock (object stores offer none): nothing is checked there. A directory this call created
    and that is still empty at the end is removed.

    Raises:
        OutputBusy: another live run holds `uri`.
        ValueError: `uri` is a file.
    """
    if is_remote(uri):
        yield
        return
    directory = local_path(uri)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(f"{uri!r} is a file: give a directory")
    created = not os.path.exists(directory)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_FILE)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            try:
                with builtins.open(path) as f:
                    holder = f.read().strip() or "another process"
            except OSError:
                holder = "another process"
            raise OutputBusy(
                f"{uri!r} is in use by another run ({holder}): wait for it to end, or choose "
                "another output directory"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False  # its last holder removed it between our open and our lock
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{command}, pid {os.getpid()}".encode())
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # while still holding the lock: the next run creates a fresh one
        os.close(fd)
        if created:  # a run that stopped before writing anything leaves no empty directory
            with contextlib.suppress(OSError):
                os.rmdir(directory)
