"""The preprocessing Flex Template: its spec file in the bucket, and optionally one example job.

The spec is what `gcloud dataflow flex-template build` would write (image, SDK, metadata with
the parameters of beam_preprocess.flex_template), plus default environment values from this stack:
workers run as the Dataflow account with the project image, temp files go under work/.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp

from llmft_infra.cloud import Cloud
from llmft_infra.settings import TEMPLATE_PREFIX, Settings

SPEC_OBJECT = f"{TEMPLATE_PREFIX}/preprocess.json"
LAUNCHER_IMAGE_NAME = "llmft-flex-launcher"
"""Launcher image, built from infra/dataflow/Dockerfile, tagged like the project image."""


@dataclass
class FlexTemplate:
    spec: gcp.storage.BucketObject
    spec_uri: pulumi.Output[str]
    job: gcp.dataflow.FlexTemplateJob | None


def container_spec(
    *, launcher_image: str, worker_image: str, service_account: str, bucket: str
) -> dict[str, Any]:
    """The Flex Template container spec (the JSON file a template launch reads)."""
    from beam_preprocess.flex_template import metadata
    from components.platform.node_facts import DATAFLOW_DISK_GB

    return {
        "image": launcher_image,
        "sdkInfo": {"language": "PYTHON"},
        "metadata": metadata(),
        "defaultEnvironment": {
            "serviceAccountEmail": service_account,
            "sdkContainerImage": worker_image,
            "tempLocation": f"gs://{bucket}/work/dataflow/tmp",
            "stagingLocation": f"gs://{bucket}/work/dataflow/staging",
            # The default 25 GB worker disk cannot pull the CUDA-sized image (C4).
            "diskSizeGb": DATAFLOW_DISK_GB,
        },
    }


def build_flex_template(
    settings: Settings, cloud: Cloud, *, image: str, launcher_image: str
) -> FlexTemplate:
    spec_json = cloud.accounts["dataflow"].email.apply(
        lambda email: json.dumps(
            container_spec(
                launcher_image=launcher_image,
                worker_image=image,
                service_account=email,
                bucket=settings.bucket,
            ),
            indent=2,
            sort_keys=True,
        )
    )
    spec = gcp.storage.BucketObject(
        "flex-template-spec",
        bucket=cloud.bucket.name,
        name=SPEC_OBJECT,
        content=spec_json,
        content_type="application/json",
    )
    spec_uri = pulumi.Output.concat("gs://", cloud.bucket.name, "/", spec.name)
    job = None
    example = settings.flex_template_job
    if example is not None:
        # One run of the template as an example of launching it from code (it needs the launcher
        # image pushed first). Deleting the stack cancels it if it still runs.
        job = gcp.dataflow.FlexTemplateJob(
            "preprocess-example",
            name="llmft-preprocess-example",
            project=settings.project,
            region=settings.region,
            container_spec_gcs_path=spec_uri,
            parameters={
                "input": example.input,
                "output": example.output,
                "tokenizer": example.tokenizer,
                "seq_len": str(example.seq_len),
            },
            service_account_email=cloud.accounts["dataflow"].email,
            sdk_container_image=image,
            temp_location=f"gs://{settings.bucket}/work/dataflow/tmp",
            staging_location=f"gs://{settings.bucket}/work/dataflow/staging",
            max_workers=example.max_workers,
            on_delete="cancel",
            labels=settings.labels,
            opts=pulumi.ResourceOptions(depends_on=[spec, *cloud.grants]),
        )
    return FlexTemplate(spec, spec_uri, job)
