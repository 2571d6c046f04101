"""Publish a compiled template: to an Artifact Registry KFP repository (Vertex) or a KFP server.

Vertex: `kfp.registry.RegistryClient.upload_pipeline` with tags (`v<package version>` and the
registry tag `latest`); the registry answers with the immutable `sha256:` version, which
automation should pin (`<registry>/<package>/sha256:...`). Runs launched from the console pick
the template from the same repository.

KFP: the first upload creates the pipeline, later ones add a version named
`v<package version>-<first 8 hex of the template's sha256>`, so re-uploading identical bytes is
reported as already present rather than silently duplicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.runtime.image import VERSION
from pipelines.deploy.clients import cloud_errors, google_credentials
from pipelines.deploy.template import check_for_backend, read_template

if TYPE_CHECKING:
    import kfp.client
    from google.auth.credentials import Credentials

_AR_HOST = r"^https://[a-z0-9-]+-kfp\.pkg\.dev/"


def default_tags() -> list[str]:
    """`v<package version>` and `latest` (a registry tag that moves; images never use it)."""
    return [f"v{VERSION}", "latest"]


@dataclass(frozen=True)
class RegistryUpload:
    """Where a template landed in Artifact Registry."""

    package: str
    version: str
    """`sha256:<digest>`: immutable; pin it in automation."""
    tags: list[str]
    uri: str
    """Template URI for `llmft run --template` / PipelineJob: `<registry>/<package>/<version>`."""


@dataclass(frozen=True)
class KfpUpload:
    """Where a template landed on a KFP server."""

    pipeline_id: str
    version_id: str
    version_name: str
    created_pipeline: bool


def upload_to_registry(
    template: str | Path,
    registry: str,
    *,
    tags: list[str] | None = None,
    credentials: Credentials | None = None,
    auth: Any = None,
) -> RegistryUpload:
    """Upload a Vertex template to a KFP-format Artifact Registry repository.

    Args:
        template: compiled YAML (the vertex target).
        registry: `https://<region>-kfp.pkg.dev/<project>/<repo>`; other https hosts are
            treated as generic KFP registries (used by tests with a local server).
        tags: defaults to `default_tags()`.
        credentials: for Artifact Registry hosts; default Application Default Credentials.
        auth: a `requests` auth object for non-Artifact-Registry hosts.
    """
    import re

    from kfp.registry import RegistryClient

    info = read_template(template)
    check_for_backend(info, "vertex")
    tags = list(tags) if tags else default_tags()
    bad = [t for t in tags if t.startswith("sha256:") or not re.fullmatch(r"[A-Za-z0-9][\w.-]*", t)]
    if bad:
        raise ValueError(
            f"tags {bad} are not valid registry tags (letters, digits, . _ -; not sha256:)"
        )
    registry = registry.rstrip("/")
    with cloud_errors(f"uploading {info.path.name} to {registry}"):
        if re.match(_AR_HOST, registry):
            client = RegistryClient(host=registry, auth=google_credentials(credentials))
        else:
            client = RegistryClient(host=registry, auth=auth)
        package, version = client.upload_pipeline(file_name=str(info.path), tags=tags)
    return RegistryUpload(
        package=package, version=version, tags=tags, uri=f"{registry}/{package}/{version}"
    )


def upload_to_kfp(
    template: str | Path,
    client: kfp.client.Client,
    *,
    pipeline_name: str,
    version_name: str | None = None,
    description: str | None = None,
    namespace: str | None = None,
) -> KfpUpload:
    """Create the pipeline on first upload, otherwise add a version to it."""
    info = read_template(template)
    version_name = version_name or f"v{VERSION}-{info.sha256[:8]}"
    path = str(info.path)
    with cloud_errors(f"uploading {info.path.name} to KFP"):
        pipeline_id = client.get_pipeline_id(pipeline_name)
        if pipeline_id is None:
            pipeline = client.upload_pipeline(
                path, pipeline_name=pipeline_name, description=description, namespace=namespace
            )
            versions = client.list_pipeline_versions(
                pipeline.pipeline_id, page_size=1, sort_by="created_at desc"
            )
            first = (versions.pipeline_versions or [None])[0]
            if first is None:
                raise ValueError(f"KFP created pipeline {pipeline.pipeline_id} without a version")
            return KfpUpload(
                pipeline.pipeline_id, first.pipeline_version_id, first.display_name, True
            )
        existing = client.list_pipeline_versions(pipeline_id, page_size=200).pipeline_versions or []
        if any(v.display_name == version_name for v in existing):
            raise ValueError(
                f"pipeline {pipeline_name} already has version {version_name} (same template "
                "bytes); pass --version-name to upload it again under another name"
            )
        version = client.upload_pipeline_version(
            path,
            pipeline_version_name=version_name,
            pipeline_id=pipeline_id,
            description=description,
        )
    return KfpUpload(pipeline_id, version.pipeline_version_id, version_name, False)
