"""Serving presets: how a prediction container starts the exported model, and how to talk to it.

A registered version only serves when Vertex AI starts its container with the right command line,
ports and routes (review item 3a). Each preset below holds what one server needs:

- `vertex-vllm`: the Vertex AI Model Garden vLLM image (`.../vertex-vision-model-garden-dockers/
  pytorch-vllm-serve:<tag>`), started as `python -m vllm.entrypoints.api_server` with the model read
  from gs:// (the image downloads it), port 8080, predict `/generate`, health `/ping`; chat requests
  go through predict as `{"instances": [{"@requestFormat": "chatCompletions", ...}]}`. Source:
  vertex-ai-samples notebooks/community/model_garden (deploy_model_vllm, 2025-12 image tags).
- `vllm-openai`: vLLM's own OpenAI-compatible server (`vllm/vllm-openai:<tag>`), started as
  `python3 -m vllm.entrypoints.openai.api_server`, reading the weights from gs:// with
  `--load-format=runai_streamer` (docs.vllm.ai models/extensions/runai_model_streamer), port 8080,
  predict `/v1/chat/completions`, health `/health`; the smoke prompt goes through rawPredict.
- `custom`: the image only (an image that reads AIP_STORAGE_URI itself, e.g. HF's TGI DLC).

A preset's command line only starts in the images it was written for, so the preset and the image
are checked as a pair (`preset_image_error`, cloud audit 2026-12-07 C2: the TGI image under the
vLLM preset registered a model that crash-looped on every deployment): `PRESET_IMAGES` names the
images (the last path component of the repository, so a copy in your own Artifact Registry keeps
its name) each preset can start; any other image needs `serving_preset=custom`.

Vertex copies the artifact to a bucket of its own and sets `AIP_STORAGE_URI`; the container's args
refer to it as `$(AIP_STORAGE_URI)` (Vertex expands `$(VAR)` in ModelContainerSpec args). For a
LoRA run the model is either the merged export (`lora_serving=merged`, the default) or the base
model plus the adapter written to `<export>/adapter` (`lora_serving=adapter`, `--enable-lora`).
`lora_serving=adapter` is refused (check_lora_serving) until it is verified on a real
project: upstream's `api_server` has no `--lora-modules`, and the Model Garden image is documented
to take an adapter per request instead (docs/deploy/README.md).

`transformers serve` (`local_server_command`) is the OpenAI-compatible server a local run starts
on CPU for its smoke prompt (components/serving/local_serving.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, fields
from typing import Any, Literal

ServingPreset = Literal["vertex-vllm", "vllm-openai", "custom"]
LoraServing = Literal["merged", "adapter"]

SERVING_PORT = 8080
"""The port every preset's server listens on (Vertex sends requests and health checks there)."""
MODEL_DIR_ENV = "$(AIP_STORAGE_URI)"
"""The model's gs:// copy as the container sees it (Vertex expands `$(VAR)` in args)."""
ADAPTER_SUBDIR = "adapter"
"""Where trainer/export.py writes a LoRA adapter inside the exported model directory."""
SHARED_MEMORY_MB = 16 * 1024
"""/dev/shm for vLLM's worker processes (Model Garden's notebooks use 16 GiB)."""
DEPLOYMENT_TIMEOUT_S = 7200
"""How long Vertex waits for the container to become healthy (loading a 70B model from gs://)."""
SMOKE_MAX_TOKENS = 32

_NAME = r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
IMAGE_REFERENCE = (
    _NAME + r"(?::\w[\w.-]{0,127}(?:@sha256:[0-9a-f]{64})?|@sha256:[0-9a-f]{64})",
    "a container image with a tag or digest, e.g. us-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG",
)
"""`serving_image`'s pattern (the distribution/reference grammar, with the tag or digest that
pins it required): a value with spaces, `;` or no tag is refused before the run, not by Vertex's
Model upload after training."""
ENDPOINT_NAME = (
    r"projects/[\w-]+/locations/[\w-]+/endpoints/[\w-]+|[^\x00-\x1f\x7f]{1,128}",
    "an endpoint resource name (projects/P/locations/L/endpoints/ID) or a display name of at "
    "most 128 characters without control characters",
)
"""`deploy_endpoint`'s pattern: Vertex AI display names are at most 128 characters."""


PRESET_IMAGES: dict[str, tuple[str, ...]] = {
    # us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:<tag>
    "vertex-vllm": ("pytorch-vllm-serve",),
    # docker.io/vllm/vllm-openai:<tag> (or a copy of it under the same name)
    "vllm-openai": ("vllm-openai",),
}
"""Image names (the repository path's last component) each non-custom preset starts."""


def image_name(image: str) -> str:
    """The image's name without registry, path, tag or digest (`.../pytorch-vllm-serve:1` ->
    `pytorch-vllm-serve`)."""
    path = image.split("@", 1)[0]
    last = path.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def preset_image_error(preset: str, image: str) -> str | None:
    """Why `preset`'s command line would not start in `image`, with the fix; None when they
    pair (or the preset is `custom`, which runs the image's own entrypoint)."""
    names = PRESET_IMAGES.get(preset)
    if not image or names is None or image_name(image) in names:
        return None
    known = ", ".join(f"{p}: {'/'.join(n)}" for p, n in PRESET_IMAGES.items())
    return (
        f"serving_image={image!r} with serving_preset={preset}: that preset starts the server "
        f"with its own command line, which exists only in its images ({known}); use such an "
        "image, or serving_preset=custom for an image that starts itself (e.g. TGI)"
    )


@dataclass(frozen=True)
class ServingSpec:
    """What the serving presets need to know about the exported model."""

    preset: ServingPreset
    image: str
    served_model_name: str
    """The name clients pass as `model` (vLLM `--served-model-name`)."""
    max_model_len: int
    """Context length to serve: the trained seq_len (vLLM's KV cache is sized from it)."""
    dtype: str = "auto"
    """vLLM `--dtype`: "auto" takes the exported config's torch dtype."""
    tensor_parallel_size: int = 1
    """GPUs the server shards the model over (the deploy step's accelerator_count)."""
    lora: bool = False
    """Whether the run trained a LoRA adapter (`lora_rank` > 0)."""
    lora_serving: LoraServing = "merged"
    base_model_uri: str = ""
    """The base model the adapter applies to (gs:// or a hub id); needed for lora_serving=adapter."""
    lora_rank: int = 0


def serving_errors(spec: ServingSpec) -> list[str]:
    """What would stop the preset from serving this model, each saying what to change."""
    errors = []
    if pairing := preset_image_error(spec.preset, spec.image):
        errors.append(pairing)
    if spec.max_model_len < 1:
        errors.append(f"max_model_len={spec.max_model_len}: must be at least 1")
    if spec.tensor_parallel_size < 1:
        errors.append(f"tensor_parallel_size={spec.tensor_parallel_size}: must be at least 1")
    if spec.lora and spec.lora_serving == "adapter":
        if unverified := check_lora_serving(spec.lora_serving):
            errors.append(unverified)
        if spec.preset != "vertex-vllm":
            # vLLM loads --lora-modules from local paths or the hub only; the Model Garden image
            # downloads gs:// paths itself.
            errors.append(
                f"lora_serving=adapter with serving_preset={spec.preset}: only the Model Garden "
                "image (serving_preset=vertex-vllm) fetches an adapter from gs://; use "
                "lora_serving=merged"
            )
        if not spec.base_model_uri:
            errors.append(
                "lora_serving=adapter needs the base model's location (the server loads the "
                "base and applies the adapter): use lora_serving=merged otherwise"
            )
    return errors


def _vllm_common(spec: ServingSpec, model: str) -> list[str]:
    """The flags both vLLM servers share (vLLM's engine arguments)."""
    args = [
        "--host=0.0.0.0",
        f"--port={SERVING_PORT}",
        f"--model={model}",
        f"--served-model-name={spec.served_model_name}",
        f"--max-model-len={spec.max_model_len}",
        f"--dtype={spec.dtype}",
        f"--tensor-parallel-size={spec.tensor_parallel_size}",
        "--gpu-memory-utilization=0.9",
        "--disable-log-stats",
    ]
    if spec.lora and spec.lora_serving == "adapter":
        # No --lora-modules: upstream's vllm.entrypoints.api_server has no such flag (only the
        # OpenAI server does), and the Model Garden image takes the adapter per request
        # ("dynamic-lora"); unverified, so serving_errors refuses lora_serving=adapter for now.
        args += ["--enable-lora", f"--max-lora-rank={_vllm_lora_rank(spec.lora_rank)}"]
    return args


def _vllm_lora_rank(rank: int) -> int:
    """vLLM accepts only some --max-lora-rank values: the smallest one that holds `rank`."""
    for allowed in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= allowed:
            return allowed
    raise ValueError(f"lora_rank={rank}: vLLM serves adapters up to rank 512")


def serving_model(spec: ServingSpec) -> str:
    """The `--model` the server loads: the export, or for an adapter its base model."""
    if spec.lora and spec.lora_serving == "adapter":
        return spec.base_model_uri
    return MODEL_DIR_ENV


@dataclass(frozen=True)
class ServingContainer:
    """The prediction container Vertex AI starts for a registered version, with the model files
    at AIP_STORAGE_URI."""

    image_uri: str
    """The image, e.g. a vLLM or TGI image pinned by tag or digest."""
    predict_route: str | None = None
    """HTTP path of the container's predict handler."""
    health_route: str | None = None
    """HTTP path of its health check."""
    ports: list[int] | None = None
    """Ports the container listens on."""
    command: list[str] | None = None
    """The container's entrypoint (None: the image's own)."""
    args: list[str] | None = None
    """Arguments for the container's entrypoint."""
    environment_variables: dict[str, str] | None = None
    """Environment for the container (never secrets: they would be readable in the model
    resource)."""
    shared_memory_size_mb: int | None = None
    """/dev/shm size (vLLM's workers share tensors through it)."""
    deployment_timeout: int | None = None
    """Seconds Vertex waits for the container to become healthy."""

    def upload_arguments(self) -> dict[str, Any]:
        """The `aiplatform.Model.upload` arguments (`serving_container_<field>`)."""
        return {f"serving_container_{f.name}": getattr(self, f.name) for f in fields(self)}


def serving_container(spec: ServingSpec) -> ServingContainer:
    """The ServingContainer (Model.upload's `serving_container_*`) of `spec`'s preset.

    Raises:
        ValueError: every problem of `spec`, in one message.
    """
    errors = serving_errors(spec)
    if errors:
        raise ValueError("cannot build the serving container: " + "; ".join(errors))
    model = serving_model(spec)
    if spec.preset == "vertex-vllm":
        return ServingContainer(
            image_uri=spec.image,
            command=["python", "-m", "vllm.entrypoints.api_server"],
            args=_vllm_common(spec, model),
            ports=[SERVING_PORT],
            predict_route="/generate",
            health_route="/ping",
            # The Model Garden image logs these; MODEL_ID names what it serves.
            environment_variables={"MODEL_ID": spec.served_model_name, "DEPLOY_SOURCE": "llmft"},
            shared_memory_size_mb=SHARED_MEMORY_MB,
            deployment_timeout=DEPLOYMENT_TIMEOUT_S,
        )
    if spec.preset == "vllm-openai":
        return ServingContainer(
            image_uri=spec.image,
            command=["python3", "-m", "vllm.entrypoints.openai.api_server"],
            # vLLM reads gs:// itself only through the Run:ai streamer.
            args=[*_vllm_common(spec, model), "--load-format=runai_streamer"],
            ports=[SERVING_PORT],
            predict_route="/v1/chat/completions",
            health_route="/health",
            environment_variables={"VLLM_NO_USAGE_STATS": "1"},
            shared_memory_size_mb=SHARED_MEMORY_MB,
            deployment_timeout=DEPLOYMENT_TIMEOUT_S,
        )
    return ServingContainer(image_uri=spec.image)


# -- the smoke prompt -------------------------------------------------------------------------------

SMOKE_PROMPT = "Reply with one short sentence: what is 2 + 2?"


def chat_body(preset: ServingPreset, served_model_name: str, prompt: str = SMOKE_PROMPT) -> bytes:
    """The HTTP body of one chat request as the preset's predict route takes it (rawPredict)."""
    messages = [{"role": "user", "content": prompt}]
    if preset == "vertex-vllm":
        instance = {
            "@requestFormat": "chatCompletions",
            "messages": messages,
            "max_tokens": SMOKE_MAX_TOKENS,
            "temperature": 0.0,
        }
        return json.dumps({"instances": [instance]}).encode()
    body = {
        "model": served_model_name,
        "messages": messages,
        "max_tokens": SMOKE_MAX_TOKENS,
        "temperature": 0.0,
    }
    return json.dumps(body).encode()


def chat_answer(response: Any) -> str | None:
    """The assistant's text from a chat response (OpenAI's shape, or Vertex's `predictions`
    wrapping it), stripped; None when the response holds no chat completion at all. An empty
    string is an answer: a tiny or barely trained model may well stop at once."""
    if isinstance(response, bytes | str):
        try:
            response = json.loads(response)
        except ValueError:
            return None
    if isinstance(response, dict) and "predictions" in response:
        predictions = response["predictions"]
        response = predictions[0] if isinstance(predictions, list) and predictions else predictions
    try:
        content = response["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if content is None:
        return ""
    return content.strip() if isinstance(content, str) else None


def local_server_command(model_dir: str, *, port: int, host: str = "127.0.0.1") -> list[str]:
    """`transformers serve` on CPU for `model_dir` (an OpenAI-compatible server with
    /v1/chat/completions and /health; needs the transformers `serving` extra)."""
    return [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        model_dir,
        f"--host={host}",
        f"--port={port}",
        "--device=cpu",
        "--no-trust-remote-code",
        "--log-level=info",
    ]


def check_lora_serving(lora_serving: str) -> str | None:
    """`lora_serving=adapter` is refused until it is verified on a real project: the Model Garden
    image's `vllm.entrypoints.api_server` is not known to accept `--lora-modules` (upstream's
    does not), and the smoke prompt would not reach the adapter (docs/deploy/README.md)."""
    if lora_serving == "adapter":
        return (
            "lora_serving=adapter is not supported yet (serving an adapter from gs:// with the "
            "Model Garden image is unverified): use lora_serving=merged"
        )
    return None
