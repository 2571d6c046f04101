"""Serve gcp-storage-emulator on 127.0.0.1 on a port the OS picks, and print that port.

Run: `python tests/gcs_emulator_server.py` (the `gcs_emulator` fixture does). The server socket is
bound before the port is printed and stays bound for the process's life, so no other process can
take the port between choosing it and using it. Objects live in memory and go with the process.
The emulator's own request handler and storage serve the GCS API as they are; only the listening
socket is ours, because the emulator's CLI cannot report a port the OS picked.

"""

from __future__ import annotations

import logging
import sys
from functools import partial
from http.server import HTTPServer

from gcp_storage_emulator.server import RequestHandler
from gcp_storage_emulator.storage import Storage


def main() -> None:
    logging.basicConfig(level=logging.CRITICAL)
    storage = Storage(use_memory_fs=True)
    # One request at a time, as the emulator's own server does: its storage is not thread-safe.
    httpd = HTTPServer(("127.0.0.1", 0), partial(RequestHandler, storage))
    print(httpd.server_address[1], flush=True)
    sys.stdout.close()
    httpd.serve_forever()


if __name__ == "__main__":
    main()
