"""The Cloud Quotas API (v1 quotaInfos.list) as a recording fake at the control-plane boundary.

`FakeCloudQuotas.session()` is a `requests` session whose transport answers
`GET /v1/projects/P/locations/global/services/S/quotaInfos` from reviewed, hand-written answers
(tests/golden/cloud_quotas_fresh_project.json: one list of pages per service, followed by
`pageToken`) and records every request; `deny()` makes every answer 403, as for a caller without
`cloudquotas.quotas.get`. The same session answers the GKE API's nodePools.list (the pool-size
check beside the quota check) from the reviewed tests/golden/gke_node_pools.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests

from fakes.recording import FakeHttp, Recorded, Reply, Router

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "cloud_quotas_fresh_project.json"
PATH = r"/v1/projects/[^/]+/locations/global/services/[^/]+/quotaInfos"
NODE_POOLS = Path(__file__).resolve().parents[1] / "golden" / "gke_node_pools.json"
NODE_POOLS_PATH = r"/v1/projects/[^/]+/locations/[^/]+/clusters/[^/]+/nodePools"


class FakeCloudQuotas:
    def __init__(self, pages: dict[str, list[dict[str, Any]]] | None = None) -> None:
        data = pages if pages is not None else json.loads(GOLDEN.read_text())
        self.pages = {k: v for k, v in data.items() if not k.startswith("_")}
        self.node_pools = json.loads(NODE_POOLS.read_text())
        self.router = Router().on("GET", PATH, self._answer)
        self.pool_router = Router().on("GET", NODE_POOLS_PATH, self._pools)
        self.denied = False

    def _pools(self, rec: Recorded) -> Reply:
        if self.denied:
            return 403, {
                "error": {
                    "code": 403,
                    "message": "Required 'container.clusters.get' permission",
                    "status": "PERMISSION_DENIED",
                }
            }
        return 200, {k: v for k, v in self.node_pools.items() if not k.startswith("_")}

    def _answer(self, rec: Recorded) -> Reply:
        if self.denied:
            return 403, {
                "error": {
                    "code": 403,
                    "message": "Permission 'cloudquotas.quotas.get' denied on resource",
                    "status": "PERMISSION_DENIED",
                }
            }
        service = rec.path.split("/services/")[1].split("/")[0]
        pages = self.pages.get(service, [{"quotaInfos": []}])
        token = rec.query.get("pageToken", "")
        index = int(token.rsplit("-", 1)[1]) - 1 if token else 0
        return 200, pages[index]

    def deny(self) -> FakeCloudQuotas:
        self.denied = True
        return self

    def session(self) -> requests.Session:
        session = requests.Session()
        session.mount("https://cloudquotas.googleapis.com/", FakeHttp(self.router))
        session.mount("https://container.googleapis.com/", FakeHttp(self.pool_router))
        return session

    @property
    def requests(self) -> list[dict[str, Any]]:
        """What was asked, for the requests golden."""
        return [
            {"method": r.method, "path": r.path, "query": r.query} for r in self.router.requests
        ]
