"""Faults found probing round 3's inputs (issue 51): price files, Hub URIs, serving settings.

- `llmft run --prices FILE`: a directory was an IsADirectoryError traceback, invalid YAML a
  YAMLError traceback, a binary file a UnicodeDecodeError line that did not name the file, and
  `{spot: .inf}` or `{spot: true}` were taken as prices (every budget then passes, or `true` is
  $1).
- `hf://datasets/o/n@../../x`: a revision (or repository, or split) of `..` passed the URI
  check; as path parts they reach other Hub API URLs and cache folders than the one named.
- `serving_image` with `; rm -rf /` or without a tag, and a `deploy_endpoint` with a newline or
  over Vertex's 128 characters, were accepted and would fail only at the register/deploy steps,
  after training was paid for.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "is a directory"),
        (b"\xa3\x01\xff binary", "is not text"),
        (b"x: [\n", "is not valid YAML"),
        (b"NVIDIA_H100_80GB: {spot: .inf}\n", "a finite number >= 0"),
        (b"NVIDIA_H100_80GB: {spot: .nan}\n", "a finite number >= 0"),
        (b"NVIDIA_H100_80GB: {spot: true}\n", "a finite number >= 0"),
        (b"NOT_A_GPU: {spot: 1}\n", "accelerator 'NOT_A_GPU' is unknown"),
    ],
)
def test_bad_price_files_are_one_error_line_naming_the_file(
    content: bytes | None, fragment: str, tmp_path: Path
):
    prices = tmp_path / "prices.yaml"
    if content is None:
        prices.mkdir()
    else:
        prices.write_bytes(content)
    result = llmft(
        "run", "--backend", "local", "--dry-run", "--prices", str(prices),
        "--param", f"workdir={tmp_path / 'w'}",
    )  # fmt: skip
    assert_user_error(result, fragment, "prices.yaml")


@pytest.mark.parametrize(
    "uri", ["hf://datasets/o/n@../../x", "hf://datasets/o/..@main", "hf://datasets/o/n@a//b"]
)
def test_hub_uris_with_dot_dot_parts_are_refused(uri: str, tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "packed"
    result = llmft(
        "preprocess", f"--input={uri}", f"--output={out}", f"--tokenizer={tiny_model_dir}",
        "--seq-len=64",
    )  # fmt: skip
    assert_user_error(result, "names no dataset")
    assert not out.exists()


@pytest.mark.parametrize(
    ("param", "fragment"),
    [
        ("serving_image=us-docker.pkg.dev/p/r/vllm:1; rm -rf /", "is not a container image"),
        ("serving_image=us-docker.pkg.dev/p/r/vllm", "with a tag or digest"),
        ("deploy_endpoint=" + "e" * 129, "at most 128 characters"),
        ("deploy_endpoint=my\nendpoint", "without control characters"),
    ],
)
def test_serving_settings_that_vertex_would_refuse_after_training(
    param: str, fragment: str, tmp_path: Path
):
    result = llmft(
        "run", "--backend", "local", "--dry-run", "--param", param,
        "--param", f"workdir={tmp_path / 'w'}",
    )  # fmt: skip
    assert_user_error(result, fragment)


def test_pinned_serving_images_and_endpoint_names_still_pass():
    import re

    from components.serving.presets import ENDPOINT_NAME, IMAGE_REFERENCE

    for image in (
        "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:20250202_0916_RC00",
        "vllm/vllm-openai:v0.6.3",
        "localhost:5000/img:v1",
        "ghcr.io/o/tgi@sha256:" + "a" * 64,
    ):
        assert re.fullmatch(IMAGE_REFERENCE[0], image), image
    for name in ("my-endpoint", "projects/p/locations/us-central1/endpoints/123", "Mein Endpunkt"):
        assert re.fullmatch(ENDPOINT_NAME[0], name), name
