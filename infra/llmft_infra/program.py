"""The whole stack: `build_stack(settings)` creates everything and returns the stack outputs.

`infra/__main__.py` calls it with the stack's config and exports the outputs, which
`llmft config from-stack` turns into the deploy config (pipelines/deploy/from_stack.py).
"""

from __future__ import annotations

from typing import Any

import pulumi

from llmft_infra import gpudirect
from llmft_infra.cloud import build_cloud
from llmft_infra.cluster import CLUSTER_NAME, build_gke
from llmft_infra.flex_template import LAUNCHER_IMAGE_NAME, build_flex_template
from llmft_infra.settings import (
    KFP_ROOT_PREFIX,
    PIPELINE_ROOT_PREFIX,
    TRAINER_ACCOUNT,
    WORK_PREFIX,
    Settings,
    names,
)


def build_stack(settings: Settings) -> dict[str, Any]:
    """Create the resources; returns the stack outputs (plain values and pulumi Outputs)."""
    from components.runtime.image import VERSION

    n = names()
    cloud, grants = build_cloud(settings, n)
    docker = f"{settings.image_registry}/{settings.project}/{n.docker_repository}"
    image = f"{docker}/{n.image_name}:{VERSION}"
    launcher_image = f"{docker}/{LAUNCHER_IMAGE_NAME}:{VERSION}"
    gke = build_gke(settings, n, cloud, grants) if settings.gke else None
    flex = build_flex_template(settings, cloud, image=image, launcher_image=launcher_image)

    bucket = f"gs://{settings.bucket}"
    outputs: dict[str, Any] = {
        "project": settings.project,
        "region": settings.region,
        "bucket": cloud.bucket.name,
        "pipeline_root": f"{bucket}/{PIPELINE_ROOT_PREFIX}",
        "kfp_pipeline_root": f"{bucket}/{KFP_ROOT_PREFIX}",
        "work_uri": f"{bucket}/{WORK_PREFIX}",
        "kfp_registry": pulumi.Output.concat(
            "https://",
            settings.region,
            "-kfp.pkg.dev/",
            settings.project,
            "/",
            cloud.kfp_repo.repository_id,
        ),
        "docker_repository": docker,
        "image": image,
        "flex_template_image": launcher_image,
        "flex_template_spec": flex.spec_uri,
        "hf_token_secret": cloud.hf_token.secret_id,
        "pipeline_service_account": cloud.accounts["pipeline"].email,
        "trainer_service_account": cloud.accounts["trainer"].email,
        "dataflow_service_account": cloud.accounts["dataflow"].email,
        "builder_service_account": cloud.accounts["builder"].email,
    }
    if gke is not None and settings.gke is not None:
        outputs.update(
            {
                "gke_cluster": pulumi.Output.concat(
                    "projects/",
                    settings.project,
                    "/locations/",
                    settings.gke.location,
                    "/clusters/",
                    gke.cluster.name,
                ),
                "gke_cluster_name": CLUSTER_NAME,
                "gke_location": settings.gke.location,
                "namespace": settings.gke.namespace,
                "pipeline_ksa": n.pipeline_ksa,
                "trainer_ksa": TRAINER_ACCOUNT,
                "accelerator_type": settings.gke.accelerator_type,
                "accelerator_count": settings.gke.accelerator_count,
                "gpu_machine_type": settings.gke.gpu_machine_type,
                # The pool has the GPUDirect NIC networks: runs pass gpudirect=true (C8).
                "gpudirect": gpudirect.setup_of(settings.gke) is not None,
            }
        )
    return outputs
