"""Options of the `etcd-v3` rendezvous (`EtcdV3RendezvousConfig`) and the backend's name.

The bottom of trainer/rendezvous: the entry point (`etcd_v3`) and the torch-side handler
(`etcd_v3_handler`) both import it, and it imports neither, so they form no cycle. It imports
nothing of torch at run time: torch loads the entry point while its own rendezvous package is
still initialising (see `etcd_v3`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousParameters

logger = logging.getLogger(__name__)

BACKEND_NAME = "etcd-v3"
DEFAULT_KEY_PREFIX = "/torch/elastic/rendezvous"

# --rdzv-conf keys read by torch's DynamicRendezvousHandler (create_handler) or set by torchrun
# itself ("rank", "timeout"); accepted silently.
_TORCH_KEYS = frozenset(
    {
        "join_timeout",
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
        "rank",
        "timeout",
    }
)
# etcd-v2 spellings (torch's etcd_rendezvous_backend) mapped to ours, so a --rdzv-conf written for
# etcd-v2 works unchanged.
_ALIASES = {"ca_cert": "cacert", "ssl_cert": "cert", "ssl_cert_key": "key"}
_OWN_KEYS = frozenset(
    {"cacert", "cert", "key", "protocol", "key_prefix", "read_timeout", "lease_ttl", "node_ttl"}
)


@dataclass(frozen=True)
class EtcdV3RendezvousConfig:
    """Resolved options of one `etcd-v3` rendezvous (from torchrun's flags and --rdzv-conf)."""

    run_id: str
    """--rdzv-id; required and unique per run, since runs that share an etcd and an id collide."""
    endpoints: tuple[str, ...]
    """--rdzv-endpoint, comma-separated `host[:port]` or URLs; tried in turn on failure."""
    cacert: str | None = None
    """CA bundle that signed etcd's server certificate; implies https for bare hosts."""
    cert: str | None = None
    """Client certificate for etcd's --client-cert-auth."""
    key: str | None = None
    """Private key of `cert`."""
    key_prefix: str = DEFAULT_KEY_PREFIX
    """All keys of the run live under `<key_prefix>/<run_id>/`."""
    read_timeout: int = 60
    """Seconds for one etcd request, and the default wait of the store's blocking reads."""
    lease_ttl: int = 600
    """Seconds the run's keys outlive the last agent that kept them alive (crash cleanup)."""
    node_ttl: int = 30
    """Seconds after which a crashed agent stops counting as present for final cleanup."""

    @property
    def run_prefix(self) -> str:
        return f"{self.key_prefix.rstrip('/')}/{self.run_id}/"

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> EtcdV3RendezvousConfig:
        """Validate torchrun's parameters, reporting every problem at once.

        Raises:
            ValueError: what to change, one line per problem.
        """
        errors: list[str] = []
        conf: dict[str, Any] = {}
        for name, value in params.config.items():
            canonical = _ALIASES.get(name, name)
            if canonical in _OWN_KEYS:
                conf[canonical] = value
            elif name not in _TORCH_KEYS:
                logger.warning("etcd-v3 rendezvous ignores unknown --rdzv-conf option %r", name)

        run_id = (params.run_id or "").strip()
        if not run_id or run_id.lower() == "none":
            errors.append(
                "--rdzv-id is missing (torchrun defaults it to 'none'): pass an id unique to this "
                "run, e.g. the pipeline run id, so runs sharing an etcd cannot join each other"
            )
        elif "/" in run_id:
            errors.append(f"--rdzv-id {run_id!r} must not contain '/' (it is an etcd key segment)")

        endpoints = tuple(e.strip() for e in (params.endpoint or "").split(",") if e.strip())
        if not endpoints:
            errors.append("--rdzv-endpoint is missing: pass etcd's host:port (comma-separated)")

        protocol = str(conf.pop("protocol", "")).strip().lower()
        if protocol not in ("", "http", "https"):
            errors.append(f"--rdzv-conf protocol={protocol!r}: use http or https")
        elif protocol:
            scheme = f"{protocol}://"
            endpoints = tuple(e if "://" in e else scheme + e for e in endpoints)

        ints: dict[str, int] = {}
        for name, default in (("read_timeout", 60), ("lease_ttl", 600), ("node_ttl", 30)):
            raw = conf.pop(name, default)
            try:
                ints[name] = int(raw)
            except (TypeError, ValueError):
                errors.append(f"--rdzv-conf {name}={raw!r}: use a whole number of seconds")
                continue
            if ints[name] <= 0:
                errors.append(f"--rdzv-conf {name}={raw!r}: must be positive")
        if not errors and ints["node_ttl"] < 3:
            errors.append("--rdzv-conf node_ttl must be at least 3 s (it is refreshed every ttl/3)")

        if conf.get("key") and not conf.get("cert"):
            errors.append("--rdzv-conf key= needs cert= (the client certificate it belongs to)")
        key_prefix = str(conf.get("key_prefix") or DEFAULT_KEY_PREFIX)
        if not key_prefix.startswith("/"):
            errors.append(f"--rdzv-conf key_prefix={key_prefix!r} must start with '/'")

        if errors:
            raise ValueError("etcd-v3 rendezvous: " + "; ".join(errors))
        return cls(
            run_id=run_id,
            endpoints=endpoints,
            cacert=conf.get("cacert") or None,
            cert=conf.get("cert") or None,
            key=conf.get("key") or None,
            key_prefix=key_prefix,
            **ints,
        )
