"""Serve gcp-storage-emulator on 127.0.0.1 on a port the OS picks, and print that port.

Run: `python tests/gcs_emulator_server.py` (the `gcs_emulator` fixture does). The server socket is
bound before the port is printed and stays bound for the process's life, so no other process can
take the port between choosing it and using it. Objects live in memory and go with the process.
The emulator's own request handler and storage serve the GCS API as they are; only the listening
socket is ours, because the emulator's CLI cannot report a port the OS picked.

One gap is closed here: the emulator does not implement `objects.moveTo`, which gcsfs tries first
for every rename (torch DCP renames its .metadata file on each save). The emulator answers 501,
which gcsfs retries with backoff for ~30 s before it falls back to copy + delete; the handler
answers 400 "not supported" at once instead, so gcsfs falls back immediately.

"""

from __future__ import annotations

import logging
import re
import sys
from functools import partial
from http.server import HTTPServer

from gcp_storage_emulator.server import RequestHandler
from gcp_storage_emulator.storage import Storage

MOVE_TO = re.compile(r"/o/[^/]+/moveTo/o/")


class Handler(RequestHandler):
    def do_POST(self) -> None:
        if MOVE_TO.search(self.path.split("?", 1)[0]):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"error": {"code": 400, "message": "objects.moveTo is not supported"}}'
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_POST()


def main() -> None:
    logging.basicConfig(level=logging.CRITICAL)
    storage = Storage(use_memory_fs=True)
    # One request at a time, as the emulator's own server does: its storage is not thread-safe.
    httpd = HTTPServer(("127.0.0.1", 0), partial(Handler, storage))
    print(httpd.server_address[1], flush=True)
    sys.stdout.close()
    httpd.serve_forever()


if __name__ == "__main__":
    main()
