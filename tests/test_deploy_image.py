"""The image and its build: pins agree with the project and nothing floats."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = (REPO / "Dockerfile").read_text()


def _constraint(name: str) -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{name} is not pinned in constraints.txt")


def test_dockerfile_pins_match_the_project() -> None:
    from packaging.specifiers import SpecifierSet

    (base,) = re.findall(r"^FROM\s+(\S+)", DOCKERFILE, flags=re.M)
    match = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-[a-z]+", base)
    assert match, f"base image {base} is not pinned to an exact python:X.Y.Z-slim-<debian> tag"
    major, minor, patch = map(int, match.groups())
    assert (major, minor) == sys.version_info[:2], "the image runs the Python the tests run on"
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert f"{major}.{minor}.{patch}" in SpecifierSet(requires)

    (torch_version,) = re.findall(r"^ARG TORCH_VERSION=(\S+)", DOCKERFILE, flags=re.M)
    assert torch_version == _constraint("torch")
    from importlib.metadata import version

    assert version("torch").split("+")[0] == torch_version  # the build the tests run on
    (index,) = re.findall(r"^ARG TORCH_INDEX_URL=(\S+)", DOCKERFILE, flags=re.M)
    assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu\d+", index), "CUDA build of torch"
    assert 'pip install -c constraints.txt ".[eval]"' in DOCKERFILE
    # torch.compile on GPU (the trainer's default there) needs a C compiler for Triton's launcher.
    assert re.search(r"apt-get install [^\n]*\bgcc\b", DOCKERFILE), "the image needs gcc"


def test_image_is_a_dataflow_custom_container() -> None:
    """Dataflow runs the image's ENTRYPOINT on workers: the Beam SDK boot copied from the
    official Beam SDK image of exactly the installed Beam, for the image's Python."""
    copies = re.findall(r"^COPY\s+--from=(\S+)\s+(\S+)\s+(\S+)\s*$", DOCKERFILE, flags=re.M)
    [(source, src, dest)] = [c for c in copies if "beam" in c[0]]
    image, _, tag = source.rpartition(":")
    python = "{}.{}".format(*sys.version_info[:2])
    assert image == f"apache/beam_python{python}_sdk"
    assert tag == _constraint("apache-beam")
    from importlib.metadata import version

    assert version("apache-beam") == tag  # the Beam the tests (and the image) run
    assert src == dest == "/opt/apache/beam"
    (entrypoint,) = re.findall(r"^ENTRYPOINT\s+(.+)$", DOCKERFILE, flags=re.M)
    assert json.loads(entrypoint) == ["/opt/apache/beam/boot"]
    # Everything the workers import is installed by the image (beam_preprocess and its deps):
    # the package itself, checked at build time by importing it.
    assert re.search(r"python -c \"import [^\"]*beam_preprocess", DOCKERFILE)
    # Dataflow's boot needs root; no USER switches away from it (pods set runAsUser instead).
    assert not re.findall(r"^USER\s+", DOCKERFILE, flags=re.M)
    from components.launchers.pytorchjob import IMAGE_UID

    assert f"--uid {IMAGE_UID}" in DOCKERFILE
    # The default Dataflow options point at this image.
    from components.params.step_params import request_of
    from components.runtime.image import DEFAULT_IMAGE
    from components.steps.preprocess import COMPONENT as PREPROCESS_STEP
    from components.steps.preprocess import beam_argv

    request = request_of(PREPROCESS_STEP, train_data_uri="gs://bkt/d/*.jsonl", base_model="gs://bkt/m", data_kind="text", seq_len=64,
        eval_fraction=0.1, preprocess_runner="DataflowRunner", project="my-project", region="us-central1",
        work_uri="gs://bkt/w", run_id="r", dataflow_options={}, dataflow_service_account="",
        hf_token_secret="", dataset=None, summary=None, gcp_resources="",
    )  # fmt: skip
    argv = beam_argv(request, "gs://bkt/o")
    assert f"--sdk_container_image={DEFAULT_IMAGE}" in argv and "--sdk_location=container" in argv
    # C4: the workers' disk holds the image (twice while it is pulled) beside the system's share
    # of Dataflow's 25 GB default; a user's own disk_size_gb wins.
    from components.platform.node_facts import (
        DATAFLOW_DEFAULT_DISK_GB,
        DATAFLOW_DISK_GB,
        IMAGE_UNPACKED_GB,
    )

    assert f"--disk_size_gb={DATAFLOW_DISK_GB}" in argv
    assert DATAFLOW_DISK_GB >= DATAFLOW_DEFAULT_DISK_GB + 2 * IMAGE_UNPACKED_GB
    own = request_of(
        PREPROCESS_STEP,
        **{**dataclasses.asdict(request.params), "dataflow_options": {"disk_size_gb": 200}},
        run_id="r", dataset=None, summary=None, gcp_resources="",
    )  # fmt: skip
    assert [a for a in beam_argv(own, "gs://bkt/o") if a.startswith("--disk_size_gb")] == [
        "--disk_size_gb=200"
    ]


def test_the_build_refuses_an_image_larger_than_the_dataflow_disk_is_sized_for() -> None:
    """C4: the Dataflow disk is sized from IMAGE_UNPACKED_GB; cloudbuild.yaml checks the built
    image against that same budget, so a bigger image fails the build, not the Dataflow job."""
    from components.platform.node_facts import IMAGE_UNPACKED_GB

    build = yaml.safe_load((REPO / "docs/deploy/cloudbuild.yaml").read_text())
    assert build["substitutions"]["_MAX_IMAGE_GB"] == str(IMAGE_UNPACKED_GB)
    (step,) = [s for s in build["steps"] if s["id"] == "check-size"]
    assert step["waitFor"] == ["build"]
    assert "docker image inspect" in step["args"][1] and "_MAX_IMAGE_GB" in step["args"][1]


def _repo_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [REPO / p for p in listed if (REPO / p).is_file()]


@pytest.mark.integration  # runs git
def test_no_image_reference_floats_on_latest() -> None:
    """Nothing shipped (code, compiled YAML, manifests, docs, Dockerfile) names a moving tag.

    An image reference ending in the moving tag; quoted checks such as endswith(":latest") are not
    references (a quote precedes the colon). tests/ is exempt: tests feed such references to
    the code to check that it refuses them.
    """
    floating = re.compile(r"[A-Za-z0-9][\w.\-/]*:" + "latest" + r"\b")
    offenders = []
    for path in _repo_text_files():
        if path.relative_to(REPO).parts[0] == "tests":
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        offenders += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in floating.finditer(text)]
    assert offenders == []


def test_cloudbuild_pushes_the_image_the_components_use() -> None:
    from components.runtime.image import DEFAULT_IMAGE, VERSION
    from pipelines.cli import app

    build = yaml.safe_load((REPO / "docs/deploy/cloudbuild.yaml").read_text())
    assert build["images"] == ["${_IMAGE}"]
    # _IMAGE is filled by the command below, never defaulted; _MAX_IMAGE_GB is the size budget.
    assert build["substitutions"]["_IMAGE"] == ""
    assert set(build["substitutions"]) == {"_IMAGE", "_MAX_IMAGE_GB"}
    for step in build["steps"]:
        name, _, tag = step["name"].rpartition(":")
        assert name and re.fullmatch(r"\d+(\.\d+)+", tag), f"builder {step['name']} is not pinned"
    guide = (REPO / "docs/deploy/README.md").read_text()
    assert "--substitutions=_IMAGE=$(llmft image-tag --full)" in guide
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert version == VERSION
    runner = CliRunner()
    assert runner.invoke(app, ["image-tag"]).output.strip() == version
    assert runner.invoke(app, ["image-tag", "--full"]).output.strip() == DEFAULT_IMAGE
    assert DEFAULT_IMAGE.endswith(f":{version}")


def _env(name: str) -> str:
    """The value the Dockerfile's ENV instructions give `name` (the last one wins)."""
    text = DOCKERFILE.replace("\\\n", " ")
    values = [
        m.group(1)
        for line in text.splitlines()
        if line.startswith("ENV ")
        for m in re.finditer(rf"(?:^ENV\s+|\s){name}=(\S+)", line)
    ]
    assert values, f"the Dockerfile sets no {name}"
    return values[-1]


def test_gke_driver_mount_is_on_the_loader_path() -> None:
    """N1: GKE mounts the NVIDIA driver under /usr/local/nvidia and sets no env; without it on
    LD_LIBRARY_PATH the CUDA torch wheel finds no libcuda and trains on CPU."""
    from components.platform.platform_facts import GKE_NVIDIA_DIR, GKE_NVIDIA_LIBRARY_PATH

    assert _env("LD_LIBRARY_PATH") == GKE_NVIDIA_LIBRARY_PATH
    assert _env("PATH").split(":")[0] == f"{GKE_NVIDIA_DIR}/bin"
    assert _env("PATH").endswith("${PATH}"), "keep the base image's PATH"
