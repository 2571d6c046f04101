"""A small client for etcd's v3 API through its JSON gateway (`/v3/kv/*`, `/v3/lease/*`).

Why not a library: the `etcd3` PyPI client fails to import with protobuf >= 4 and `python-etcd`
speaks the v2 API that etcd 3.4 disables, 3.5 deprecates and 3.6 removes. The gateway ships with
every etcd >= 3.4 on the client port, so plain HTTP with `requests` needs nothing else on the
workers. Keys and values are bytes; the gateway wants them base64-encoded, and 64-bit integers
come back as JSON strings.

Only the calls the rendezvous needs are here: range, put, delete-range, txn (compare-and-set),
lease grant / keep-alive / revoke, and `/health`.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import requests

logger = logging.getLogger(__name__)

DEFAULT_PORT = 2379

# gRPC status codes etcd reports in the gateway's error body.
_GRPC_NOT_FOUND = 5
_GRPC_ALREADY_EXISTS = 9
_GRPC_UNAVAILABLE = 14


class EtcdV3Error(Exception):
    """etcd answered with an error (the gateway's `{"error", "code"}` body)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class EtcdV3ConnectionError(EtcdV3Error):
    """No endpoint could be reached (all were tried in turn)."""


class EtcdV3LeaseNotFound(EtcdV3Error):
    """The lease does not exist (never granted, expired or revoked)."""


class EtcdV3LeaseExists(EtcdV3Error):
    """A lease with the requested id already exists."""


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd returns it; revisions are etcd's cluster-wide counters."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(data: str | None) -> bytes:
    return base64.b64decode(data) if data else b""


def _as_bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def prefix_range_end(prefix: bytes) -> bytes:
    """The exclusive end of the key range holding every key that starts with `prefix`.

    etcd's rule (clientv3.GetPrefixRangeEnd): increment the last byte below 0xff, dropping
    trailing 0xff bytes; an all-0xff prefix means "to the end of the keyspace" (b"\\0").
    """
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(raw.get("key")),
        value=_unb64(raw.get("value")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        version=int(raw.get("version", 0)),
        lease=int(raw.get("lease", 0)),
    )


def normalize_endpoints(endpoints: str | Sequence[str], *, tls: bool) -> list[str]:
    """`"h1:2379,https://h2"` -> `["http(s)://h1:2379", "https://h2:2379"]`.

    A bare `host[:port]` gets https when TLS files are configured, http otherwise; the port
    defaults to 2379 (etcd's client port).
    """
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    urls = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        scheme, sep, rest = item.partition("://")
        if not sep:
            scheme, rest = ("https" if tls else "http"), item
        if scheme not in ("http", "https"):
            raise ValueError(f"etcd endpoint {item!r}: the scheme must be http or https")
        hostport = rest.rstrip("/")
        host = hostport.rsplit(":", 1)[0] if not hostport.endswith("]") else hostport
        if host == hostport:  # no port given
            hostport = f"{hostport}:{DEFAULT_PORT}"
        urls.append(f"{scheme}://{hostport}")
    if not urls:
        raise ValueError("no etcd endpoint given: pass host:port (comma-separated for several)")
    return urls


class EtcdV3Client:
    """Talks to one etcd cluster through any of its endpoints.

    Requests go to the endpoint that last answered; on a connection error or timeout the next one
    is tried, so a client survives the loss of a member as long as one endpoint answers.

    Args:
        endpoints: `host:port` or URLs, as a list or one comma-separated string.
        ca_cert: CA bundle that signed etcd's server certificate (enables https for bare hosts).
        cert: client certificate (PEM) for etcd's `--client-cert-auth`.
        key: the client certificate's private key (PEM).
        timeout: seconds to connect and to read each response.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        ca_cert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        if key and not cert:
            raise ValueError("etcd TLS: a client key was given without its certificate (cert)")
        if timeout <= 0:
            raise ValueError(f"etcd timeout must be positive, got {timeout}")
        self.endpoints = normalize_endpoints(endpoints, tls=bool(ca_cert or cert))
        self.timeout = timeout
        self._session = requests.Session()
        # Passed with every request rather than set on the session: requests lets
        # $REQUESTS_CA_BUNDLE override a session's `verify`, but not a request's.
        self._verify: str | bool = ca_cert or True
        self._cert: str | tuple[str, str] | None = (cert, key) if cert and key else cert
        self._current = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        self._session.close()

    # -- transport -------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        with self._lock:
            start = self._current
        failures = []
        for offset in range(len(self.endpoints)):
            index = (start + offset) % len(self.endpoints)
            url = self.endpoints[index] + path
            try:
                response = self._session.request(
                    method,
                    url,
                    json=body,
                    timeout=self.timeout,
                    verify=self._verify,
                    cert=self._cert,
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                failures.append(f"{url}: {type(exc).__name__}")
                continue
            try:
                payload = response.json()
            except ValueError:
                payload = {"error": response.text.strip() or f"HTTP {response.status_code}"}
            code = payload.get("code") if isinstance(payload, dict) else None
            if response.status_code >= 500 and code in (None, _GRPC_UNAVAILABLE):
                # A member without quorum or shutting down: another member may still serve.
                failures.append(f"{url}: HTTP {response.status_code} {payload.get('error', '')}")
                continue
            with self._lock:
                self._current = index
            if "error" in payload:
                message = f"etcd {path}: {payload.get('message') or payload['error']}"
                if code == _GRPC_NOT_FOUND and "lease" in message:
                    raise EtcdV3LeaseNotFound(message, code)
                if code == _GRPC_ALREADY_EXISTS and "lease" in message:
                    raise EtcdV3LeaseExists(message, code)
                raise EtcdV3Error(message, code)
            if response.status_code >= 400:
                raise EtcdV3Error(f"etcd {path}: HTTP {response.status_code}", None)
            return payload
        raise EtcdV3ConnectionError("cannot reach etcd: " + "; ".join(failures))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", path, body)

    # -- health ----------------------------------------------------------------------------

    def healthy(self) -> bool:
        """True when an endpoint reports `{"health": "true"}` (the member has a leader)."""
        try:
            payload = self._request("GET", "/health", None)
        except EtcdV3Error:
            return False
        return str(payload.get("health")).lower() == "true"

    # -- key-value -------------------------------------------------------------------------

    def get(self, key: str | bytes) -> KeyValue | None:
        payload = self._post("/v3/kv/range", {"key": _b64(_as_bytes(key))})
        kvs = payload.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str | bytes, *, keys_only: bool = False) -> list[KeyValue]:
        raw = _as_bytes(prefix)
        body: dict[str, Any] = {"key": _b64(raw), "range_end": _b64(prefix_range_end(raw))}
        if keys_only:
            body["keys_only"] = True
        return [_kv(kv) for kv in self._post("/v3/kv/range", body).get("kvs") or []]

    def count_prefix(self, prefix: str | bytes) -> int:
        raw = _as_bytes(prefix)
        body = {"key": _b64(raw), "range_end": _b64(prefix_range_end(raw)), "count_only": True}
        return int(self._post("/v3/kv/range", body).get("count", 0))

    def put(self, key: str | bytes, value: str | bytes, *, lease: int = 0) -> int:
        """Write a key; returns the cluster revision of the write."""
        body: dict[str, Any] = {"key": _b64(_as_bytes(key)), "value": _b64(_as_bytes(value))}
        if lease:
            body["lease"] = str(lease)
        return int(self._post("/v3/kv/put", body)["header"]["revision"])

    def delete(self, key: str | bytes) -> int:
        """Delete one key; returns how many keys were deleted (0 or 1)."""
        payload = self._post("/v3/kv/deleterange", {"key": _b64(_as_bytes(key))})
        return int(payload.get("deleted", 0))

    def delete_prefix(self, prefix: str | bytes) -> int:
        raw = _as_bytes(prefix)
        body = {"key": _b64(raw), "range_end": _b64(prefix_range_end(raw))}
        return int(self._post("/v3/kv/deleterange", body).get("deleted", 0))

    def get_many(self, keys: Sequence[str | bytes]) -> dict[bytes, KeyValue]:
        """Read several keys at one revision (a compare-less txn); missing keys are absent."""
        ops = [{"request_range": {"key": _b64(_as_bytes(k))}} for k in keys]
        payload = self._post("/v3/kv/txn", {"success": ops})
        found: dict[bytes, KeyValue] = {}
        for response in payload.get("responses") or []:
            for raw in (response.get("response_range") or {}).get("kvs") or []:
                kv = _kv(raw)
                found[kv.key] = kv
        return found

    def put_if(
        self, key: str | bytes, value: str | bytes, *, mod_revision: int, lease: int = 0
    ) -> tuple[bool, int, KeyValue | None]:
        """Compare-and-set: write only if the key's mod revision is `mod_revision`.

        `mod_revision=0` means "only if the key does not exist". One round trip either way.

        Returns:
            (written, revision of the write or of the read, the key's current value when the
            write was refused, None if it is absent or the write succeeded).
        """
        raw_key = _b64(_as_bytes(key))
        put: dict[str, Any] = {"key": raw_key, "value": _b64(_as_bytes(value))}
        if lease:
            put["lease"] = str(lease)
        compare = {
            "key": raw_key,
            "result": "EQUAL",
            "target": "MOD",
            "mod_revision": str(mod_revision),
        }
        body = {
            "compare": [compare],
            "success": [{"request_put": put}],
            "failure": [{"request_range": {"key": raw_key}}],
        }
        payload = self._post("/v3/kv/txn", body)
        revision = int(payload["header"]["revision"])
        if payload.get("succeeded"):
            return True, revision, None
        kvs = (payload.get("responses") or [{}])[0].get("response_range", {}).get("kvs") or []
        return False, revision, _kv(kvs[0]) if kvs else None

    # -- leases ----------------------------------------------------------------------------

    def lease_grant(self, ttl: int, lease_id: int = 0) -> int:
        """Grant a lease of `ttl` seconds; `lease_id=0` lets etcd pick the id. Returns the id."""
        body: dict[str, Any] = {"TTL": str(ttl)}
        if lease_id:
            body["ID"] = str(lease_id)
        return int(self._post("/v3/lease/grant", body)["ID"])

    def lease_keepalive(self, lease_id: int) -> int:
        """Refresh a lease; returns its new TTL, or raises EtcdV3LeaseNotFound if it is gone."""
        payload = self._post("/v3/lease/keepalive", {"ID": str(lease_id)})
        # The gateway wraps the stream's single message in "result"; a lease that is gone comes
        # back with no TTL rather than an error.
        ttl = int((payload.get("result") or {}).get("TTL", 0))
        if ttl <= 0:
            raise EtcdV3LeaseNotFound(f"etcd lease {lease_id:x} not found", _GRPC_NOT_FOUND)
        return ttl

    def lease_revoke(self, lease_id: int) -> bool:
        """Revoke a lease and delete its keys; False when it was already gone."""
        try:
            self._post("/v3/lease/revoke", {"ID": str(lease_id)})
        except EtcdV3LeaseNotFound:
            return False
        return True
