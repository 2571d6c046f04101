"""The pipeline's preprocess step: run the Beam pipeline and describe what it wrote.

`run(PreprocessRequest)` is what the `preprocess` KFP component calls; `run_beam(argv)` is the
step's core. Locally it runs the DirectRunner engine in process; with runner="DataflowRunner" it
submits the job, writes the `gcp_resources` output (the format Google Cloud Pipeline Components use
for Dataflow jobs, so cancelling the Vertex pipeline cancels the job), cancels the job itself on
SIGTERM (a cancelled KFP-on-GKE pod), and waits.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from dataclasses import asdict, dataclass
from typing import Any

from beam_preprocess import data_shape
from beam_preprocess.data_shape import DataShape
from components.params.by_step import PreprocessParams
from components.params.run_params import RunParams
from components.platform.node_facts import DATAFLOW_DISK_GB
from components.runtime.artifacts import data_artifact_uri
from components.runtime.image import DEFAULT_IMAGE
from components.runtime.model_location import is_hub_id
from components.runtime.run_identity import resource_name, safe_run_id
from components.runtime.secrets import load_hf_token
from components.steps.component_spec import StepComponent, component_input
from trainer.gguf import is_gguf, resolve_gguf

log = logging.getLogger(__name__)

DATAFLOW_JOB_URI = (
    "https://dataflow.googleapis.com/v1b3/projects/{project}/locations/{region}/jobs/{job_id}"
)


def gcp_resources_json(project: str, region: str, job_id: str) -> str:
    """The `gcp_resources` document for one Dataflow job (GCPC's GcpResources proto as JSON)."""
    uri = DATAFLOW_JOB_URI.format(project=project, region=region, job_id=job_id)
    return json.dumps({"resources": [{"resourceType": "DataflowJob", "resourceUri": uri}]})


def build_argv(
    *,
    input_uri: str,
    output_uri: str,
    tokenizer: str,
    seq_len: int,
    runner: str = RunParams.preprocess_runner,
    eval_fraction: float = RunParams.eval_fraction,
    shape: Any = None,
    max_rejected_fraction: float = 0.1,
    train_on_prompt: bool = False,
    overwrite: bool = True,
    num_workers: int = 0,
    stage_dir: str = "",
    beam_options: dict[str, Any] | None = None,
    extra_args: list[str] | None = None,
) -> list[str]:
    """`beam_preprocess` flags: the dataset's own, the data settings of `shape` (anything with
    the `DataShape` fields: a `DataShape`, the preprocess step's params; each setting its own flag), and
    Beam's pipeline options from `beam_options` (empty values left to Beam's defaults)."""
    argv = [
        f"--input={input_uri}",
        f"--output={output_uri}",
        f"--tokenizer={tokenizer}",
        f"--seq-len={seq_len}",
        f"--runner={runner}",
        f"--eval-fraction={eval_fraction}",
        f"--max-rejected-fraction={max_rejected_fraction}",
        *data_shape.as_flags(shape or DataShape()),
    ]
    if stage_dir:
        argv.append(f"--stage-dir={stage_dir}")
    if train_on_prompt:
        argv.append("--train-on-prompt")
    if overwrite:
        argv.append("--overwrite")
    if runner == "DirectRunner" and num_workers:
        argv.append(f"--direct_num_workers={num_workers}")
    argv += [f"--{flag}={value}" for flag, value in (beam_options or {}).items() if value]
    return argv + list(extra_args or [])


def resolve_tokenizer(argv: list[str]) -> list[str]:
    """`argv` with `--tokenizer` turned into a tokenizer directory Beam (and its workers) can read.

    - A GGUF base model: Beam reads tokenizer directories and never imports torch, so it is
      resolved here, before Beam starts, to the converted model directory (trainer/gguf.py,
      cached per machine by content, the same directory the train and evaluate steps load).
    - A hub id on DataflowRunner (issue 29 N5): workers carry no Hugging Face token and, without
      public IPs, cannot reach the hub at all, so this step (which has the token) downloads the
      tokenizer once.
    For DataflowRunner the tokenizer files are then staged to
    `<temp_location>/llmft-tokenizers/<name>/`, because workers cannot see this machine's disk.
    """
    import argparse

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--tokenizer", "--runner", "--temp_location"):
        parser.add_argument(flag, default="")
    known, _ = parser.parse_known_args(argv)
    # apache_beam: beam_preprocess.pipeline takes 4.7 s to import (min of 3, shared 2-core
    # machine); importing this module (KFP's component, its unit tests) stays Beam-free
    from beam_preprocess.pipeline import DATAFLOW_RUNNERS

    dataflow = known.runner in DATAFLOW_RUNNERS
    if is_gguf(known.tokenizer):
        staging = _staging_dir(known.temp_location, "a .gguf tokenizer") if dataflow else ""
        resolved = resolve_gguf(known.tokenizer)
        if staging:
            resolved = _stage_tokenizer(resolved, staging)
    elif dataflow and is_hub_id(known.tokenizer):
        import tempfile

        # +0.26 s at import (min of 3, shared 2-core machine): only a hub tokenizer on Dataflow
        from beam_preprocess import tokenize

        staging = _staging_dir(known.temp_location, "a hub tokenizer")
        with tempfile.TemporaryDirectory(prefix="llmft-tokenizer-") as tmp:
            local = os.path.join(tmp, known.tokenizer.replace("/", "--"))
            tokenize.load_tokenizer(known.tokenizer).save_pretrained(local)
            resolved = _stage_tokenizer(local, staging)
    else:
        return argv
    log.info("tokenizer %s resolved to %s", known.tokenizer, resolved)
    out = []
    for i, arg in enumerate(argv):
        if arg == f"--tokenizer={known.tokenizer}":
            arg = f"--tokenizer={resolved}"
        elif arg == known.tokenizer and i > 0 and argv[i - 1] == "--tokenizer":
            arg = resolved
        out.append(arg)
    return out


def _staging_dir(temp_location: str, what: str) -> str:
    """Where tokenizers are staged for Dataflow workers (checked before anything is fetched)."""
    if not temp_location.startswith("gs://"):
        raise ValueError(
            f"{what} on DataflowRunner needs --temp_location gs://... to stage the tokenizer "
            "for the workers"
        )
    return f"{temp_location.rstrip('/')}/llmft-tokenizers"


def _stage_tokenizer(local_dir: str, staging: str) -> str:
    """Copy a tokenizer directory's files to `<staging>/<its name>`; returns that URI."""
    import fsspec

    staged = f"{staging}/{os.path.basename(local_dir.rstrip('/'))}"
    fs, root = fsspec.core.url_to_fs(staged)
    for file in os.listdir(local_dir):
        if file.startswith(("tokenizer", "chat_template", "special_tokens")):
            fs.put(os.path.join(local_dir, file), f"{root}/{file}")
    return staged


def run_beam(argv: list[str], *, gcp_resources_path: str | None = None) -> dict[str, Any]:
    """Run preprocessing with `beam_preprocess` flags (`build_argv`); returns
    {"metadata": {...}, "summary_markdown": str, "manifest": {...}}.

    Args:
        argv: the `beam_preprocess` flags.
        gcp_resources_path: where to write the `gcp_resources` JSON once a Dataflow job exists
            (the component's output path on Vertex); ignored for local runs.
    """
    # apache_beam: 4.7 s to import (min of 3, shared 2-core machine), only when Beam runs
    from beam_preprocess.pipeline import DATAFLOW_RUNNERS, finish, launch

    argv = resolve_tokenizer(argv)
    launched = launch(argv)
    if launched.runner in DATAFLOW_RUNNERS:
        job_id = launched.result.job_id()
        log.info("submitted Dataflow job %s", job_id)
        if gcp_resources_path:
            os.makedirs(os.path.dirname(gcp_resources_path) or ".", exist_ok=True)
            from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

            gcp = PipelineOptions(argv).view_as(GoogleCloudOptions)
            with open(gcp_resources_path, "w") as f:
                f.write(gcp_resources_json(gcp.project, gcp.region, job_id))
        _cancel_on_sigterm(launched.result)
    manifest = finish(launched)
    data = asdict(manifest)
    metadata = dataset_metadata(data)
    return {"metadata": metadata, "summary_markdown": summary_markdown(data), "manifest": data}


def _cancel_on_sigterm(result: Any) -> None:
    """A cancelled KFP-on-GKE run sends SIGTERM to this pod: take the Dataflow job down with it."""

    def handler(signum: int, _frame: Any) -> None:
        log.warning("signal %s: cancelling the Dataflow job", signum)
        try:
            result.cancel()
        finally:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def dataset_metadata(manifest: dict[str, Any]) -> dict[str, Any]:
    """Flat numbers for the Dataset artifact's metadata (shown in the Vertex/KFP UI)."""
    seq_len = manifest["seq_len"]
    splits = manifest["splits"]
    rows = sum(s["rows"] for s in splits.values())
    tokens = sum(s["tokens"] for s in splits.values())
    stats = manifest["stats"]
    meta: dict[str, Any] = {
        "seq_len": seq_len,
        "rows": rows,
        "tokens": tokens,
        "fill_ratio": round(tokens / (rows * seq_len), 4) if rows else 0.0,
        "tokenizer": manifest["tokenizer"]["name_or_path"],
    }
    for name, info in splits.items():
        meta[f"{name}_rows"] = info["rows"]
        meta[f"{name}_tokens"] = info["tokens"]
        meta[f"{name}_target_tokens"] = info["target_tokens"]
    for key in ("records_read", "kept", "filtered", "duplicates", "rejected"):
        meta[key] = stats[key]
    return meta


def summary_markdown(manifest: dict[str, Any]) -> str:
    """A Markdown report of the run's accounting and output, for the step's Markdown artifact."""
    meta = dataset_metadata(manifest)
    stats = manifest["stats"]
    lines = [
        "# Preprocessing summary",
        "",
        f"Tokenizer `{meta['tokenizer']}`, seq_len {meta['seq_len']}, "
        f"{manifest['data_kind']} data; fill ratio **{meta['fill_ratio']:.4f}**.",
        "",
        "| split | rows | documents | tokens | target tokens |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, info in manifest["splits"].items():
        lines.append(
            f"| {name} | {info['rows']:,} | {info['documents']:,} | {info['tokens']:,} | "
            f"{info['target_tokens']:,} |"
        )
    lines += [
        "",
        "| records | count |",
        "|---|---:|",
        f"| read | {stats['records_read']:,} |",
        f"| kept | {stats['kept']:,} |",
        f"| duplicates removed | {stats['duplicates']:,} |",
        f"| filtered | {stats['filtered']:,} |",
        f"| rejected (see rejected/) | {stats['rejected']:,} |",
    ]
    for kind in ("filtered", "rejected"):
        for reason, count in sorted(stats[f"{kind}_by_reason"].items()):
            lines.append(f"| {kind}: {reason} | {count:,} |")
    for name, count in sorted(stats.get("unused_fields", {}).items()):
        lines.append(f"| field `{name}` present but unused | {count:,} |")
    lines += _mix_lines(stats.get("mix"))
    return "\n".join(lines) + "\n"


def _mix_lines(mix: dict[str, Any] | None) -> list[str]:
    """The weighted mix's per-source table (beam_preprocess/mix.py), when there is one."""
    if not mix:
        return []
    lines = [
        "",
        "| source | replay | read | kept | not sampled | rejected | passes | train tokens | "
        "share (target) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, s in mix["sources"].items():
        lines.append(
            f"| `{label}` | {'yes' if s['replay'] else ''} | {s['records_read']:,} | "
            f"{s['kept']:,} | {s['not_sampled']:,} | {s['rejected']:,} | {s['passes']} | "
            f"{s['train_tokens']:,} | {s['share']:.3f} ({s['target_share']:.3f}) |"
        )
    lines += (
        ["", *(f"warning: {w}" for w in mix.get("warnings", []))] if mix.get("warnings") else []
    )
    return lines


_DATAFLOW_OPTIONS = {
    "temp_location": "temp_location",
    "staging_location": "staging_location",
    "service_account": "service_account_email",
    "service_account_email": "service_account_email",
    "network": "network",
    "subnetwork": "subnetwork",
    "machine_type": "machine_type",
    "max_num_workers": "max_num_workers",
    "sdk_container_image": "sdk_container_image",
    "job_name": "job_name",
}
"""dataflow_options keys that override the step's own Dataflow options (by Beam's flag name);
other keys pass through as flags."""


@dataclass(frozen=True)
class PreprocessRequest:
    """The `preprocess` component: its run parameters and its own inputs and outputs."""

    params: PreprocessParams
    """The run parameters the preprocess step takes (`steps=(...)` in components/params/run_params.py;
    components/params/step_params.py `for_step`)."""
    run_id: str = component_input("str")
    dataset: Any = component_input("Output[Dataset]")
    """The Dataset artifact written (by `.uri`; its `.metadata` is set here)."""
    summary: Any = component_input("Output[Markdown]")
    """The Markdown artifact the summary goes to (by `.path`)."""
    gcp_resources: str = component_input("OutputPath(str)")
    """Path of the component's gcp_resources output (always written; empty for local runs)."""

    @property
    def dataflow(self) -> bool:
        return self.params.preprocess_runner in ("DataflowRunner", "dataflow")


COMPONENT = StepComponent(
    name="preprocess",
    request=PreprocessRequest,
    returns=(("dataset_uri", "str"),),
    doc="""Turn raw records into packed, tokenized Parquet shards with Apache Beam.

Runs the Beam pipeline in-process (DirectRunner) or submits it to Dataflow and waits; the
Dataflow job is written to `gcp_resources` (the console's link to it); cancelling the
pipeline cancels the job through this step's SIGTERM handler.

Returns:
    dataset_uri: the Dataset artifact's URI, for steps that only pass it on (a string is
        not downloaded into their pod the way an input artifact is).
""",
)


def beam_argv(request: PreprocessRequest, output_uri: str) -> list[str]:
    """The request's `beam_preprocess` flags, writing the dataset to `output_uri`.

    The base model's tokenizer tokenizes `train_data_uri` (the run parameters' names). The
    dataset is written to the artifact's URI (components/runtime/artifacts.py says why `.uri`): a local
    path under kfp.local, gs:// in the cloud (Dataflow workers cannot see the launcher's disk).

    On Dataflow: the workers run the project image (`sdk_container_image`, a Dataflow custom
    container: see the Dockerfile) as `dataflow_service_account`; temp and staging files go under
    `<work_uri>/dataflow/<run>/`; the job runs in the run's region and is named after the run.
    `dataflow_options` entries override any of these. Locally only `direct_*` flags apply of
    them; the record shape, chat template and BigQuery query are parameters of their own and
    apply everywhere. hf:// inputs are staged under `<work_uri>/staged/` (a cache shared by
    runs: one copy per dataset commit). The HF token is read at run time (`run`), never a flag.
    """
    p = request.params
    options: dict[str, Any] = {}
    extra: list[str] = []
    for key, value in (p.dataflow_options or {}).items():
        if key in _DATAFLOW_OPTIONS:
            options[_DATAFLOW_OPTIONS[key]] = value
        elif isinstance(value, bool):
            extra.append(f"--{key}" if value else f"--no_{key}")
        else:
            extra.append(f"--{key}={value}")
    if request.dataflow:
        if p.work_uri.startswith("gs://"):
            files = f"{p.work_uri.rstrip('/')}/dataflow/{safe_run_id(request.run_id)}"
            options.setdefault("temp_location", f"{files}/tmp")
            options.setdefault("staging_location", f"{files}/staging")
        options.setdefault("job_name", resource_name("preprocess", request.run_id))
        options.setdefault("sdk_container_image", DEFAULT_IMAGE)
        if not any(flag.startswith("--sdk_location") for flag in extra):
            extra.append("--sdk_location=container")  # the image has Beam: stage no SDK
        if not any(flag.startswith("--disk_size_gb") for flag in extra):
            # The default 25 GB boot disk cannot pull the CUDA-sized image (C4).
            extra.append(f"--disk_size_gb={DATAFLOW_DISK_GB}")
        if p.dataflow_service_account:
            options.setdefault("service_account_email", p.dataflow_service_account)
        options.update(project=p.project, region=p.region)
    else:
        # Dataflow settings mean nothing to the local runner; its own (direct_*) still apply.
        options = {}
        extra = [flag for flag in extra if flag.startswith("--direct_")]
    return build_argv(
        input_uri=p.train_data_uri,
        output_uri=output_uri,
        tokenizer=p.base_model,
        seq_len=p.seq_len,
        runner=p.preprocess_runner,
        eval_fraction=p.eval_fraction,
        shape=p,
        stage_dir=f"{p.work_uri.rstrip('/')}/staged" if p.work_uri else "",
        beam_options=options,
        extra_args=extra,
    )


def run(request: PreprocessRequest) -> tuple[str]:
    """The `preprocess` component: write the dataset, its Markdown summary and gcp_resources,
    describe the Dataset artifact, and return `(dataset_uri,)`."""
    dataset = request.dataset
    dataset.uri = data_artifact_uri(
        dataset.uri, work_uri=request.params.work_uri, run_id=request.run_id, name="dataset"
    )
    # The tokenizer may be a gated hub model; the token comes from Secret Manager by name.
    load_hf_token(project=request.params.project, secret=request.params.hf_token_secret)
    argv = beam_argv(request, dataset.uri)
    with open(request.gcp_resources, "w") as f:
        f.write(json.dumps({"resources": []}))
    result = run_beam(argv, gcp_resources_path=request.gcp_resources if request.dataflow else None)
    summary_path = request.summary.path
    os.makedirs(os.path.dirname(summary_path) or ".", exist_ok=True)
    with open(summary_path, "w") as f:
        f.write(result["summary_markdown"])
    dataset.metadata.update(result["metadata"])
    return (str(dataset.uri),)
