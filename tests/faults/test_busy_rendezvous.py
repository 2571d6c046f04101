"""Fault: a busy rendezvous endpoint hung silently (issue 37, fifth bullet).

With `--rdzv-endpoint` on a port another process listens on, c10d agents became clients of that
process and waited out the 10-minute rendezvous timeout; etcd-v3 ended in a traceback after ~70 s.
Now the preflight probes the endpoint and refuses at once: exit 2 and one `error:` line, before
any agent starts.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft

pytestmark = pytest.mark.integration


@pytest.fixture
def foreign_listener():
    """A process-local server that accepts connections and never answers (a stranger's port)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


@pytest.mark.parametrize("backend", ["c10d", "etcd-v3", "etcd-v2"])
def test_busy_rendezvous_port_is_refused_at_once(
    backend: str, foreign_listener: str, tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    out = tmp_path / "run"
    result = llmft(
        "train", "--model", str(tiny_model_dir), "--data", str(small_dataset),
        "--output", str(out), "--max-steps", "1",
        "--rdzv-backend", backend, "--rdzv-endpoint", foreign_listener,
    )  # fmt: skip
    assert_user_error(result, f"--rdzv-endpoint {foreign_listener}")
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (out / "logs").exists()  # no agent was started
