"""A Hugging Face Hub on loopback: file downloads as the real hub answers them.

`huggingface_hub.hf_hub_download` asks `HEAD {endpoint}/{repo}/resolve/{revision}/{file}` for the
commit and ETag, then GETs the file. Gated repositories answer with `X-Error-Code: GatedRepo`:
401 to a request without a token, 403 to a token without access; unknown repositories and files
404 with `RepoNotFound` / `EntryNotFound`, which is how the client tells its errors apart. Point
a process at it with `HF_ENDPOINT=hub.url` (and `HF_HUB_OFFLINE=0`: the tests' default is
offline).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fakes.recording import LocalHttpServer, Recorded


class FakeHub(LocalHttpServer):
    """`repos`: {"owner/name": {"config.json": bytes}}; `gated`: {"owner/name": the one token
    granted access}."""

    def __init__(
        self,
        repos: dict[str, dict[str, bytes]],
        gated: dict[str, str] | None = None,
        datasets: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.repos, self.gated = repos, dict(gated or {})
        self.datasets = dict(datasets or {})
        """{"owner/name": the JSON `GET /api/datasets/owner/name/revision/REV` answers (the
        Hub's fields: "id", "sha", "cardData")}; change it to publish a new commit."""
        self.unavailable = False
        """Answer every file request 503 (an outage: huggingface_hub retries those)."""
        self.downloads: list[tuple[str, str | None]] = []
        """(path, Authorization header) of each file sent (a GET answered 200)."""

    def _dataset_info(self, repo: str) -> tuple[int, bytes, dict[str, str]]:
        if repo not in self.datasets:
            return 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}
        return 200, json.dumps(self.datasets[repo]).encode(), {"Content-Type": "application/json"}

    def handle(self, rec: Recorded) -> tuple[int, bytes, dict[str, str]]:
        auth = next((v for k, v in rec.headers.items() if k.lower() == "authorization"), None)
        parts = rec.path.split("?")[0].strip("/").split("/")
        if parts[:2] == ["api", "datasets"] and len(parts) >= 4:
            return self._dataset_info("/".join(parts[2:4]))
        if len(parts) < 5 or parts[2] != "resolve":  # e.g. the client's optional API lookups
            return 404, b'{"error": "Not found"}', {}
        repo, filename = "/".join(parts[:2]), "/".join(parts[4:])
        if self.unavailable:
            return 503, b'{"error": "Service unavailable"}', {}
        if repo in self.gated and auth != f"Bearer {self.gated[repo]}":
            status = 403 if auth else 401
            return status, b'{"error": "Access restricted"}', {"X-Error-Code": "GatedRepo"}
        files = self.repos.get(repo)
        if files is None:
            return 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}
        if filename not in files:
            return 404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"}
        if rec.method == "GET":
            self.downloads.append((rec.path, auth))
        data = files[filename]
        etag = f'"{hashlib.sha1(data).hexdigest()}"'
        return 200, data, {"X-Repo-Commit": "0" * 40, "ETag": etag}
