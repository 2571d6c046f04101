"""A local run's rendezvous, checked before any agent starts (the train step on the local
backend, `llmft train`): the etcd binary for a run that starts its own, a free port for c10d, an
etcd answering at a given endpoint."""

from __future__ import annotations

import socket

PROBE_TIMEOUT_S = 3.0
"""How long the rendezvous probe waits for a connection or an answer."""


def check_rendezvous(rdzv_backend: str, endpoint: str) -> None:
    """Refuse a local rendezvous that cannot work, before any agent starts (an agent would
    otherwise wait out its rendezvous timeout: 10 minutes for c10d, a traceback after ~70 s for
    etcd). No endpoint: the run starts its own etcd (etcd-v3 / etcd-v2), so the binary must exist.

    c10d on this machine: the first local agent hosts the store there, so the port must be free
    (a foreign listener makes every agent a client of something that never answers). etcd-v3 /
    etcd-v2: an etcd must answer at the endpoint (GET /version).

    Raises:
        ValueError: one line: what is wrong, and what to pass instead.
    """
    if not endpoint:
        if rdzv_backend != "c10d":
            # etcd's client imports requests (~200 modules): only for an etcd rendezvous
            from components.etcd.local import find_etcd

            find_etcd()  # EtcdNotFoundError (a ValueError): how to install it, or use c10d
        return
    host, _, port_text = endpoint.rpartition(":")
    port = int(port_text)
    if rdzv_backend == "c10d":
        if _is_this_machine(host) and _listening(host, port):
            raise ValueError(
                f"--rdzv-endpoint {endpoint}: the port is already in use by another process, and "
                "the c10d store of this run must listen there: pick a free port, or leave "
                "--rdzv-endpoint empty to get one"
            )
        return
    problem = _etcd_problem(endpoint)
    if problem:
        raise ValueError(
            f"--rdzv-endpoint {endpoint}: no etcd answers there ({problem}): pass a running "
            "etcd's client endpoint, or leave --rdzv-endpoint empty to start one for the run"
        )


def _is_this_machine(host: str) -> bool:
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return False
    if address.startswith("127.") or address == "0.0.0.0":
        return True
    try:
        return address == socket.gethostbyname(socket.gethostname())
    except OSError:
        return False


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _etcd_problem(endpoint: str) -> str:
    """Why `endpoint` is not an etcd client endpoint ("" when it is one)."""
    import requests

    try:
        response = requests.get(f"http://{endpoint}/version", timeout=PROBE_TIMEOUT_S)
        version = response.json()
    except requests.RequestException as exc:
        return f"{type(exc).__name__}"
    except ValueError:
        return "the answer is not etcd's"
    if not isinstance(version, dict) or "etcdserver" not in version:
        return "the answer is not etcd's"
    return ""
