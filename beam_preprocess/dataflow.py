"""Dataflow specifics: checking the options before submission and building the job request offline.

Dataflow fails late and vaguely on a bad setup (a local --output is written on a worker's disk and
lost; workers without the package die with ModuleNotFoundError after minutes of start-up). These
checks say what to change before anything is submitted.
"""

from __future__ import annotations

import re
from typing import Any

from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    WorkerOptions,
)

from beam_preprocess.options import PreprocessConfig
from beam_preprocess.sources import is_file_pattern

_SA = re.compile(
    r"^[a-z0-9-]+@[a-z0-9-]+\.iam\.gserviceaccount\.com$|^[0-9]+-compute@developer\.gserviceaccount\.com$"
)
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]$")
_SUBNET = re.compile(
    r"^(https://www\.googleapis\.com/compute/v1/projects/[^/]+/)?regions/[a-z0-9-]+/subnetworks/[^/]+$"
)


def validate_dataflow_options(options: PipelineOptions, config: PreprocessConfig) -> list[str]:
    """Every reason the job would fail on Dataflow, as messages saying what to change."""
    gcp = options.view_as(GoogleCloudOptions)
    worker = options.view_as(WorkerOptions)
    setup = options.view_as(SetupOptions)
    errors = []
    if not gcp.project:
        errors.append("--project is required with DataflowRunner")
    if not gcp.region:
        errors.append("--region is required with DataflowRunner (e.g. us-central1)")
    elif not _REGION.match(gcp.region):
        errors.append(f"--region {gcp.region!r} is not a region name like us-central1")
    for flag, value in (
        ("--temp_location", gcp.temp_location),
        ("--staging_location", gcp.staging_location),
    ):
        if value and not value.startswith("gs://"):
            errors.append(f"{flag} must be a gs:// path (got {value!r})")
    if not gcp.temp_location:
        errors.append("--temp_location gs://BUCKET/tmp is required with DataflowRunner")
    if gcp.service_account_email and not _SA.match(gcp.service_account_email):
        errors.append(
            f"--service_account_email {gcp.service_account_email!r} is not a service account "
            "email (NAME@PROJECT.iam.gserviceaccount.com)"
        )
    if worker.subnetwork and not _SUBNET.match(worker.subnetwork):
        errors.append(
            f"--subnetwork {worker.subnetwork!r} must be regions/REGION/subnetworks/NAME or its "
            "full https://www.googleapis.com/compute/v1/... URL"
        )
    if worker.subnetwork and gcp.region and f"regions/{gcp.region}/" not in worker.subnetwork:
        errors.append(f"--subnetwork {worker.subnetwork!r} is not in --region {gcp.region}")
    if worker.max_num_workers is not None and worker.max_num_workers < 1:
        errors.append(f"--max_num_workers must be >= 1 (got {worker.max_num_workers})")
    if (
        worker.num_workers
        and worker.max_num_workers
        and worker.num_workers > worker.max_num_workers
    ):
        errors.append("--num_workers is above --max_num_workers")
    if worker.machine_type and not re.match(r"^[a-z0-9]+-[a-z0-9-]+$", worker.machine_type):
        errors.append(
            f"--machine_type {worker.machine_type!r} is not a machine type like n2-standard-8"
        )
    if not (worker.sdk_container_image or setup.setup_file or setup.extra_packages):
        errors.append(
            "Dataflow workers need this package: pass --sdk_container_image with the project "
            "image (recommended) or --setup_file pointing at the project's setup/pyproject"
        )
    remote = ("gs://",)
    files = [p for p in config.inputs if is_file_pattern(p)]
    hf = any(p.startswith("hf://") for p in config.inputs)
    if hf and not config.stage_dir.startswith(remote):
        errors.append("hf:// inputs on Dataflow need --stage-dir gs://... to stage them to")
    for flag, value in [("--input", p) for p in files] + [("--output", config.output)]:
        if not value.startswith(remote):
            errors.append(
                f"{flag} {value!r} must be a gs:// path: Dataflow workers cannot see local files"
            )
    if config.tokenizer.startswith("/") or config.tokenizer.startswith("."):
        errors.append(
            f"--tokenizer {config.tokenizer!r} is a local path: upload it to gs:// or use a hub name"
        )
    return errors


def build_job_request(pipeline: Any, options: PipelineOptions) -> tuple[Any, Any]:
    """The Dataflow Job and Environment messages Beam would submit, built offline (no API call).

    Used to check a graph and its worker settings without credentials (tests, dry runs).
    """
    from apache_beam.runners.dataflow.internal import apiclient
    from apache_beam.transforms import environments

    # As DataflowRunner.run_pipeline does: the workers run the SDK container image.
    default_environment = environments.DockerEnvironment.from_container_image(
        apiclient.get_container_image_from_options(options),
        artifacts=environments.python_sdk_dependencies(options),
        resource_hints=environments.resource_hints_from_options(options),
    )
    proto_pipeline = pipeline.to_runner_api(default_environment=default_environment)
    job = apiclient.Job(options, proto_pipeline)
    environment = apiclient.Environment(
        packages=[],
        options=options,
        environment_version="8",
        proto_pipeline_staged_url="gs://staged/pipeline.pb",
        proto_pipeline=proto_pipeline,
    )
    return job, environment
