"""Serve the exported model on this machine with a real OpenAI-compatible server, send the smoke
prompt, stop the server: what the `deploy` step does for a local run.

The server is `transformers serve` (the transformers `serving` extra: FastAPI + uvicorn), on CPU,
on a loopback port held for it (components/runtime/ports.py). Readiness is its `/health` answering, and
the process dying first is a failure with its log's tail; the server is stopped whatever happens.

Run by hand: `python -m components.serving.local_serving MODEL_DIR`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from components.runtime.ports import LOOPBACK, ReservedPort
from components.serving.presets import SMOKE_PROMPT, chat_answer, chat_body, local_server_command

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0
"""How long the server may take to start (importing torch and FastAPI on a loaded 2-core box)."""
REQUEST_TIMEOUT_S = 300.0
"""How long one chat completion may take on CPU."""


@dataclass(frozen=True)
class SmokeResult:
    """The smoke prompt's outcome."""

    url: str
    """The server's chat route."""
    prompt: str
    answer: str


def _get(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _wait_ready(proc: subprocess.Popen[bytes], base: str, log_path: str, timeout_s: float) -> None:
    """Block until GET /health answers 200; fail when the server exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the local model server exited with {proc.returncode} before answering:\n"
                + _tail(log_path)
            )
        if _get(f"{base}/health", timeout=2.0) == 200:
            return
        # The server has no readiness signal but its port: wait on the process a moment, so an
        # early exit is seen at once, then ask again.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
    raise RuntimeError(
        f"the local model server did not answer {base}/health within {timeout_s:.0f} s:\n"
        + _tail(log_path)
    )


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def serve_and_smoke(
    model_dir: str,
    *,
    prompt: str = SMOKE_PROMPT,
    ready_timeout_s: float = READY_TIMEOUT_S,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> SmokeResult:
    """Start `transformers serve` on `model_dir`, ask `prompt` through /v1/chat/completions, stop.

    Raises:
        RuntimeError: the server did not start, or answered nothing.
    """
    with tempfile.NamedTemporaryFile(prefix="llmft-serve-", suffix=".log", delete=False) as f:
        log_path = f.name
    reserved = ReservedPort()
    base = f"http://{LOOPBACK}:{reserved.port}"
    command = local_server_command(model_dir, port=reserved.port)
    log.info("starting the local model server: %s", " ".join(command))
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        reserved.release()  # the server binds it with SO_REUSEADDR
        _wait_ready(proc, base, log_path, ready_timeout_s)
        url = f"{base}/v1/chat/completions"
        body = json.loads(chat_body("vllm-openai", model_dir, prompt))
        body["stream"] = False
        request = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=request_timeout_s) as response:
                answer = chat_answer(response.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(
                f"the local model server answered {exc.code} to the smoke prompt: "
                f"{exc.read()[:500]!r}\n" + _tail(log_path)
            ) from None
        if answer is None:
            raise RuntimeError(
                "the local model server returned no chat completion for the smoke prompt\n"
                + _tail(log_path)
            )
        if not answer:
            log.warning("the model answered the smoke prompt with an empty message")
        log.info("smoke prompt %r answered %r by %s", prompt, answer, url)
        return SmokeResult(url=url, prompt=prompt, answer=answer)
    finally:
        reserved.release()
        _stop(proc)
        log.info("stopped the local model server (log: %s)", log_path)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = serve_and_smoke(sys.argv[1])
    print(json.dumps(result.__dict__))
