"""The one project image: every component, the PyTorchJob and the Vertex CustomJob run it.

The tag is the package version, kept in one place (here); the Dockerfile and cloudbuild.yaml take
it from `llmft image-tag` / this module, and a test checks they agree. Never `:latest`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("llmft")
except PackageNotFoundError:  # running from a source tree that is not installed
    VERSION = "0.1.0"

IMAGE_REPOSITORY = "us-docker.pkg.dev/llmft-project/llmft/llmft"
"""Artifact Registry repository the image is pushed to. Change it here, build the image, then
compile: the compiled YAML names the image, and the image's own launchers start the CustomJob,
PyTorchJob and Dataflow workers with the same name, so it cannot be a compile-time flag."""

DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{VERSION}"
