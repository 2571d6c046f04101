"""`llmft`: the command line. Every command's work lives in an importable module; this file only
parses flags and turns user errors (ValueError, FileNotFoundError) into a one-line message and
exit code 2, never a stack trace.

Heavy imports (torch, Beam, KFP, Google SDKs) happen inside each command so `llmft --help` is fast.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from components.run_params import RunParams

app = typer.Typer(
    name="llmft",
    help="Fine-tune LLMs with Kubeflow Pipelines: locally, on Vertex AI, or on KFP on GKE.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(func: F) -> F:
    """Report user mistakes as `error: <message>` and exit 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, FileNotFoundError, PermissionError) as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def parse_params(pairs: list[str] | None) -> dict[str, Any]:
    """KEY=VALUE pairs; values are parsed as JSON when they parse (numbers, bools, lists)."""
    params: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {pair!r} is not KEY=VALUE")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


@app.command("sample-data")
@user_errors
def sample_data(
    out_dir: Annotated[
        Path, typer.Argument(help="Directory to write train/heldout/dirty JSONL to.")
    ],
    train: Annotated[int, typer.Option(help="Training records.")] = 4000,
    heldout: Annotated[int, typer.Option(help="Held-out records (prompts never in train).")] = 400,
    seed: Annotated[int, typer.Option(help="RNG seed; same seed, same bytes.")] = 0,
) -> None:
    """Write a deterministic instruction dataset (+ held-out, + dirty variant)."""
    from pipelines.quickstart.sample_data import write_sample_data

    _print_json(write_sample_data(out_dir, n_train=train, n_heldout=heldout, seed=seed))


@app.command("tiny-model")
@user_errors
def tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to save the model and tokenizer to.")],
    data: Annotated[
        Path | None, typer.Option(help="Sample data dir to train the tokenizer on.")
    ] = None,
    vocab_size: Annotated[int, typer.Option(help="BPE vocabulary size.")] = 4096,
    hidden_size: Annotated[int, typer.Option(help="Model width.")] = 256,
    layers: Annotated[int, typer.Option(help="Decoder layers.")] = 4,
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
) -> None:
    """Build a tiny Llama + trained BPE tokenizer and save them with save_pretrained."""
    from pipelines.quickstart.tiny_model import build_tiny_model

    _print_json(
        build_tiny_model(
            out_dir,
            data_dir=data,
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_layers=layers,
            seed=seed,
        )
    )


@app.command("compile")
@user_errors
def compile_cmd(
    target: Annotated[
        str, typer.Option(help="vertex (single document), kfp (with kfp-kubernetes) or all.")
    ] = "all",
    output_dir: Annotated[Path, typer.Option(help="Where to write the YAML files.")] = Path(
        "compiled"
    ),
) -> None:
    """Compile the fine-tune pipeline (and, with --target all, every component) to YAML."""
    from pipelines.compile import compile_all

    _not_a_file(output_dir, "--output-dir")
    for path in compile_all(target, output_dir):
        typer.echo(f"wrote {path}")


# Options shared by `upload`, `run` and `schedule` (pipelines/deploy/config.py documents each).
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML settings (see docs/deploy/example.yaml).")
]
ParamOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--param", help="Run parameter KEY=VALUE (repeatable; the parameters are listed below)."
    ),
]


def _parameters_epilog() -> str:
    """Every run parameter with its default and description (components/run_params.py)."""
    from components.run_params import defaults, describe

    lines = ["Run parameters (--param KEY=VALUE, or `parameters:` in --config):", ""]
    for name, default in defaults().items():
        # Rich reads [...] as markup: escape the bracket.
        lines.append(f"  {name} \\[default: {json.dumps(default)}]: {describe(name)}")
    return "\n\n".join(lines)


TemplateOpt = Annotated[
    str | None,
    typer.Option(
        help="Compiled YAML or registry URI [default: compiled/fine_tune.<backend>.yaml]."
    ),
]
ProjectOpt = Annotated[str | None, typer.Option(help="Vertex: Google Cloud project id.")]
RegionOpt = Annotated[
    str | None, typer.Option(help=f"Vertex: Google Cloud region [default: {RunParams.region}].")
]
RootOpt = Annotated[str | None, typer.Option(help="Where runs write artifacts (gs:// on Vertex).")]
AccountOpt = Annotated[
    str | None, typer.Option(help="Vertex: service-account email; KFP: Kubernetes service account.")
]
NetworkOpt = Annotated[str | None, typer.Option(help="Vertex: projects/N/global/networks/NAME.")]
LabelOpt = Annotated[
    list[str] | None, typer.Option("--label", help="Vertex: label KEY=VALUE (repeatable).")
]
CachingOpt = Annotated[
    bool | None, typer.Option(help="Override caching for every task [default: as compiled].")
]
HostOpt = Annotated[
    str | None, typer.Option(help="KFP: API endpoint [default: $KF_PIPELINES_ENDPOINT].")
]
NamespaceOpt = Annotated[str | None, typer.Option(help="KFP: profile namespace (multi-user).")]
PipelineIdOpt = Annotated[
    str | None, typer.Option(help="KFP: uploaded pipeline id (with --version-id).")
]
VersionIdOpt = Annotated[
    str | None, typer.Option(help="KFP: uploaded pipeline version id (from `llmft upload`).")
]


def _labels(pairs: list[str] | None) -> dict[str, str]:
    labels = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--label {pair!r} is not KEY=VALUE")
        labels[key] = value
    return labels


def _check_backend(backend: str, allowed: tuple[str, ...], flag: str = "--backend") -> Any:
    if backend not in allowed:
        raise ValueError(f"{flag} {backend!r}: choose one of {', '.join(allowed)}")
    return backend


@app.command("image-tag")
def image_tag(
    full: Annotated[bool, typer.Option(help="Print repository:tag instead of the tag.")] = False,
) -> None:
    """Print the project image tag (the package version) for docs/deploy/cloudbuild.yaml."""
    from components.image import DEFAULT_IMAGE, VERSION

    typer.echo(DEFAULT_IMAGE if full else VERSION)


@app.command("upload")
@user_errors
def upload_cmd(
    target: Annotated[str, typer.Option(help="vertex (Artifact Registry) or kfp (KFP server).")],
    template: Annotated[
        Path | None, typer.Option(help="Compiled YAML [default: compiled/fine_tune.<target>.yaml].")
    ] = None,
    config: ConfigOpt = None,
    registry: Annotated[
        str | None, typer.Option(help="Vertex: https://<region>-kfp.pkg.dev/<project>/<repo>.")
    ] = None,
    tag: Annotated[
        list[str] | None, typer.Option("--tag", help="Vertex: tags [default: v<version>, latest].")
    ] = None,
    host: HostOpt = None,
    namespace: NamespaceOpt = None,
    pipeline_name: Annotated[
        str | None, typer.Option(help="KFP: pipeline name [default: llmft-fine-tune].")
    ] = None,
    version_name: Annotated[
        str | None, typer.Option(help="KFP: version name [default: v<version>-<sha256[:8]>].")
    ] = None,
    description: Annotated[str | None, typer.Option(help="KFP: version description.")] = None,
) -> None:
    """Publish a compiled pipeline: Vertex -> Artifact Registry (prints the sha256 version), KFP -> pipeline version."""
    import dataclasses

    from pipelines.deploy.config import load_for, validate

    backend = _check_backend(target, ("vertex", "kfp"), "--target")
    flags: dict[str, Any] = {"template": str(template) if template else None}
    if backend == "vertex":
        flags["registry"] = registry
    else:
        flags.update(host=host, namespace=namespace, pipeline_name=pipeline_name)
    cfg = load_for(backend, config, **flags)
    validate(cfg, backend, "upload")
    assert cfg.template
    if backend == "vertex":
        from pipelines.deploy.upload import upload_to_registry

        assert cfg.vertex.registry
        uploaded = upload_to_registry(cfg.template, cfg.vertex.registry, tags=tag)
        typer.echo(f"uploaded {uploaded.package} {uploaded.version}", err=True)
        _print_json(dataclasses.asdict(uploaded))
        return
    import contextlib
    import sys

    from pipelines.deploy.clients import kfp_client
    from pipelines.deploy.upload import upload_to_kfp

    # kfp.Client prints UI links; keep stdout for the JSON that automation reads.
    with contextlib.redirect_stdout(sys.stderr):
        result = upload_to_kfp(
            cfg.template,
            kfp_client(cfg.kfp),
            pipeline_name=cfg.kfp.pipeline_name,
            version_name=version_name,
            description=description,
            namespace=cfg.kfp.namespace,
        )
    _print_json(dataclasses.asdict(result))


@app.command("run", epilog=_parameters_epilog())
@user_errors
def run_cmd(
    backend: Annotated[
        str, typer.Option(help="local (this machine), vertex (Vertex AI Pipelines) or kfp (KFP).")
    ] = "local",
    config: ConfigOpt = None,
    param: ParamOpt = None,
    template: TemplateOpt = None,
    display_name: Annotated[str | None, typer.Option(help="Run name prefix.")] = None,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    pipeline_root: RootOpt = None,
    service_account: AccountOpt = None,
    network: NetworkOpt = None,
    label: LabelOpt = None,
    experiment: Annotated[
        str | None, typer.Option(help="Vertex AI Experiment / KFP experiment to file the run in.")
    ] = None,
    enable_caching: CachingOpt = None,
    failure_policy: Annotated[
        str | None, typer.Option(help="Vertex: fast or slow [default: slow].")
    ] = None,
    host: HostOpt = None,
    namespace: NamespaceOpt = None,
    pipeline_id: PipelineIdOpt = None,
    version_id: VersionIdOpt = None,
    schedule_time: Annotated[
        str | None,
        typer.Option(
            help="Fill the schedule-time placeholder (backfill), e.g. 2026-01-05T03:00:00Z."
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="Follow the run and exit non-zero if it fails.")
    ] = False,
    verbose: Annotated[
        bool, typer.Option(help="Local: also stream the tasks' logs to the terminal.")
    ] = False,
) -> None:
    """Run the fine-tune pipeline: on this machine, on Vertex AI Pipelines, or on KFP."""
    import datetime as dt
    import typing
    from typing import Literal

    params = parse_params(param)
    if _check_backend(backend, ("local", "vertex", "kfp")) == "local":
        from pipelines.local_run import run_local

        remote = {"--template": template, "--display-name": display_name, "--project": project,
                  "--region": region, "--pipeline-root": pipeline_root,
                  "--service-account": service_account, "--network": network, "--label": label,
                  "--experiment": experiment, "--enable-caching": enable_caching,
                  "--failure-policy": failure_policy, "--host": host, "--namespace": namespace,
                  "--pipeline-id": pipeline_id, "--version-id": version_id,
                  "--schedule-time": schedule_time, "--wait": wait or None}  # fmt: skip
        ignored = [flag for flag, value in remote.items() if value not in (None, [])]
        if ignored:
            typer.secho(f"warning: --backend local ignores {', '.join(ignored)}", err=True)

        result = run_local(params, config, verbose=verbose)
        if not result.succeeded:
            raise typer.Exit(1)
        return
    from pipelines.deploy.config import load_for

    cfg = load_for(
        typing.cast(Literal["vertex", "kfp"], backend),
        config,
        template=template,
        display_name=display_name,
        parameters=params,
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        service_account=service_account,
        network=network,
        labels=_labels(label),
        experiment=experiment,
        enable_caching=enable_caching,
        failure_policy=failure_policy,
        host=host,
        namespace=namespace,
        pipeline_id=pipeline_id,
        version_id=version_id,
    )
    when = None
    if schedule_time:
        try:
            when = dt.datetime.fromisoformat(schedule_time.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"--schedule-time {schedule_time!r} is not like 2026-01-05T03:00:00Z"
            ) from None
    if backend == "vertex":
        from pipelines.deploy.submit import submit_vertex

        submit_vertex(cfg, schedule_time=when, wait=wait, report=typer.echo)
    else:
        from pipelines.deploy.submit import submit_kfp

        submit_kfp(cfg, schedule_time=when, wait=wait, report=typer.echo)


@app.command("schedule", epilog=_parameters_epilog())
@user_errors
def schedule_cmd(
    backend: Annotated[
        str, typer.Option(help="vertex (PipelineJobSchedule) or kfp (recurring run).")
    ],
    config: ConfigOpt = None,
    param: ParamOpt = None,
    cron: Annotated[
        str | None,
        typer.Option(
            help="5 fields, optional CRON_TZ=<zone> prefix, e.g. 'CRON_TZ=UTC 0 3 * * 1'."
        ),
    ] = None,
    display_name: Annotated[
        str | None, typer.Option(help="Schedule name (--update and --list match on it).")
    ] = None,
    template: TemplateOpt = None,
    max_concurrent_runs: Annotated[
        int | None, typer.Option(help="Runs at once [default: 1].")
    ] = None,
    start_time: Annotated[str | None, typer.Option(help="RFC 3339 time of the first run.")] = None,
    end_time: Annotated[
        str | None, typer.Option(help="RFC 3339 time after which none start.")
    ] = None,
    max_run_count: Annotated[int | None, typer.Option(help="Vertex: stop after N runs.")] = None,
    allow_queueing: Annotated[
        bool | None, typer.Option(help="Vertex: queue runs over the concurrency limit.")
    ] = None,
    catchup: Annotated[
        bool | None, typer.Option(help="KFP: start missed runs after a pause.")
    ] = None,
    list_: Annotated[
        bool, typer.Option("--list", help="List schedules (of --display-name).")
    ] = False,
    pause: Annotated[str | None, typer.Option(help="Pause this schedule id.")] = None,
    resume: Annotated[str | None, typer.Option(help="Resume this schedule id.")] = None,
    delete: Annotated[str | None, typer.Option(help="Delete this schedule id.")] = None,
    update: Annotated[
        bool,
        typer.Option("--update", help="Point the schedules named --display-name at --template."),
    ] = False,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    pipeline_root: RootOpt = None,
    service_account: AccountOpt = None,
    network: NetworkOpt = None,
    label: LabelOpt = None,
    enable_caching: CachingOpt = None,
    experiment: Annotated[
        str | None, typer.Option(help="KFP: experiment of the recurring run.")
    ] = None,
    host: HostOpt = None,
    namespace: NamespaceOpt = None,
    pipeline_id: PipelineIdOpt = None,
    version_id: VersionIdOpt = None,
) -> None:
    """Create (default), list, pause, resume, delete or --update recurring fine-tunes."""
    import typing
    from typing import Literal

    from pipelines.deploy import schedule as sched
    from pipelines.deploy.config import load_for

    target = typing.cast(Literal["vertex", "kfp"], _check_backend(backend, ("vertex", "kfp")))
    actions = [n for n, on in (("--list", list_), ("--pause", pause), ("--resume", resume),
                               ("--delete", delete), ("--update", update)) if on]  # fmt: skip
    if len(actions) > 1:
        raise ValueError(f"choose one of {', '.join(actions)}")
    cfg = load_for(
        target,
        config,
        template=template,
        parameters=parse_params(param),
        cron=cron,
        display_name=display_name,
        max_concurrent_runs=max_concurrent_runs,
        start_time=start_time,
        end_time=end_time,
        max_run_count=max_run_count,
        allow_queueing=allow_queueing,
        catchup=catchup,
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        service_account=service_account,
        network=network,
        labels=_labels(label),
        enable_caching=enable_caching,
        experiment=experiment,
        host=host,
        namespace=namespace,
        pipeline_id=pipeline_id,
        version_id=version_id,
    )
    if display_name:
        # One flag names both the run and the schedule; schedules match on the latter.
        cfg.schedule.display_name = display_name
    if list_:
        rows = sched.list_schedules(cfg, backend, display_name=display_name)
        for row in rows:
            typer.echo(
                f"{row.name}\t{row.display_name}\t{row.state}\t{row.cron}\tnext: {row.next_run}"
            )
        if not rows:
            typer.echo("no schedules", err=True)
    elif pause or resume or delete:
        action: sched.Action = "pause" if pause else "resume" if resume else "delete"
        sched.manage_schedule(
            cfg, target, action, pause or resume or delete or "", report=typer.echo
        )
    elif update:
        if backend == "vertex":
            sched.update_vertex_schedules(cfg, report=typer.echo)
        else:
            sched.update_kfp_schedules(cfg, report=typer.echo)
    elif backend == "vertex":
        sched.create_vertex_schedule(cfg, report=typer.echo)
    else:
        sched.create_kfp_schedule(cfg, report=typer.echo)


@app.command("train")
@user_errors
def train_cmd(
    model: Annotated[
        str, typer.Option(help="Base model: HF save_pretrained directory or .gguf file.")
    ],
    data: Annotated[str, typer.Option(help="Packed dataset directory (llmft preprocess).")],
    output: Annotated[
        str, typer.Option(help="Run directory: model/, metrics.jsonl, summary.json, logs/.")
    ],
    backend: Annotated[
        str, typer.Option(help="Where to run: local (torchrun agents here).")
    ] = "local",
    nodes: Annotated[int, typer.Option(help="Nodes: separate torchrun agents.")] = RunParams.nodes,
    nproc_per_node: Annotated[
        int, typer.Option(help="Worker processes per node (0: one).")
    ] = RunParams.nproc_per_node,
    max_steps: Annotated[
        int | None, typer.Option(help="Optimizer steps (default: the trainer's `epochs`).")
    ] = None,
    rdzv_backend: Annotated[
        str, typer.Option(help="etcd-v3 | etcd-v2 | c10d.")
    ] = RunParams.rdzv_backend,
    rdzv_endpoint: Annotated[
        str,
        typer.Option(help="host:port; empty starts a local etcd for the run (c10d: a free port)."),
    ] = "",
    run_id: Annotated[str | None, typer.Option(help="Run id (default: generated).")] = None,
    config: Annotated[
        str | None, typer.Option(help="Trainer YAML config (--config of the trainer).")
    ] = None,
    max_restarts: Annotated[
        int, typer.Option(help="torchrun restarts after a worker failure.")
    ] = 0,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Trainer field KEY=VALUE (repeatable).")
    ] = None,
) -> None:
    """Fine-tune on N nodes x P processes (local: torchrun agents with etcd rendezvous)."""
    import uuid

    from components.launchers.base import LaunchCancelled, LaunchFailed, TrainLaunch
    from components.launchers.local import LocalOptions
    from components.param_checks import resolve_nproc_per_node
    from components.steps.train import train

    if backend != "local":
        raise ValueError(
            f"--backend {backend}: `llmft train` runs locally; use `llmft run --backend {backend}` "
            "(the pipeline) or `llmft render pytorchjob` for GKE"
        )
    _not_a_file(output, "--output")
    trainer = _trainer_config(model, data, output, config, max_steps, set_)
    try:
        launch = TrainLaunch(
            run_id=run_id or f"local-{uuid.uuid4().hex[:10]}",
            trainer=trainer,
            nodes=nodes,
            nproc_per_node=resolve_nproc_per_node("local", nproc_per_node, 0),
            rdzv_backend=rdzv_backend,
            rdzv_endpoint=rdzv_endpoint,
            max_restarts=max_restarts,
        )
        metadata = train(launch, LocalOptions())
    except LaunchFailed as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(130 if isinstance(exc, LaunchCancelled) else 1) from None
    _print_json(metadata)


def _trainer_config(
    model: str,
    data: str,
    output: str,
    config: str | None,
    max_steps: int | None,
    set_: list[str] | None,
) -> Any:
    """The TrainConfig these flags describe, read by the trainer's own parser (so each flag means
    what it means to `python -m trainer`); every problem in one ValueError."""
    from trainer.config import load_config

    argv = ["--model", model, "--data", data, "--output", output]
    argv += ["--config", config] if config else []
    argv += ["--max-steps", str(max_steps)] if max_steps is not None else []
    for pair in set_ or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {pair!r} is not KEY=VALUE")
        argv += [f"--{key}", value]
    return load_config(argv)


def _not_a_file(path: str | Path, flag: str) -> None:
    """Refuse an output directory that is an existing file (instead of a traceback later)."""
    if "://" not in str(path) and Path(path).is_file():
        raise ValueError(f"{flag} {str(path)!r} is a file: give a directory")


render_app = typer.Typer(help="Print manifests without creating anything.", no_args_is_help=True)
app.add_typer(render_app, name="render")


@render_app.command("pytorchjob")
@user_errors
def render_pytorchjob(
    model: Annotated[
        str, typer.Option(help="Base model URI as the pods see it.")
    ] = "gs://BUCKET/models/base",
    data: Annotated[str, typer.Option(help="Packed dataset URI.")] = "gs://BUCKET/runs/RUN/dataset",
    output: Annotated[str, typer.Option(help="Run directory URI.")] = "gs://BUCKET/runs/RUN/train",
    run_id: Annotated[
        str, typer.Option(help="Run id (names, labels, rendezvous id).")
    ] = "example-run",
    namespace: Annotated[str, typer.Option(help="Kubernetes namespace.")] = RunParams.namespace,
    nodes: Annotated[int, typer.Option(help="Worker pods.")] = RunParams.nodes,
    nproc_per_node: Annotated[
        int,
        typer.Option(
            help=f"Processes (GPUs) per pod; 0: one per GPU ({RunParams.accelerator_count} with "
            "an accelerator, else 1)."
        ),
    ] = RunParams.nproc_per_node,
    rdzv_backend: Annotated[
        str, typer.Option(help="etcd-v3 | etcd-v2 | c10d.")
    ] = RunParams.rdzv_backend,
    rdzv_endpoint: Annotated[
        str, typer.Option(help="host:port (default: the run's etcd Service).")
    ] = "",
    max_steps: Annotated[int | None, typer.Option(help="Optimizer steps.")] = None,
    image: Annotated[str | None, typer.Option(help="Image (default: the project image).")] = None,
    accelerator: Annotated[
        str,
        typer.Option(help="Vertex accelerator name or GKE accelerator label; '' for CPU."),
    ] = RunParams.accelerator_type,
    cpu: Annotated[str | None, typer.Option(help="CPU per pod.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory per pod.")] = None,
    shm_size: Annotated[str, typer.Option(help="/dev/shm size.")] = "64Gi",
    service_account: Annotated[
        str, typer.Option(help="Workload Identity KSA ('' for the namespace's default).")
    ] = RunParams.service_account,
    hf_token_secret: Annotated[
        str, typer.Option(help="Secret with the HF token (name[:key]; '' for none).")
    ] = RunParams.hf_token_secret,
    gang_scheduling: Annotated[
        bool, typer.Option(help="All pods or none (needs a gang scheduler).")
    ] = False,
    active_deadline_seconds: Annotated[
        int | None, typer.Option(help="Hard run-time limit.")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Trainer field KEY=VALUE (repeatable).")
    ] = None,
) -> None:
    """Print the PyTorchJob (Kubeflow Training Operator v1) a GKE run would create, as YAML."""
    from components.image import DEFAULT_IMAGE
    from components.launchers.base import TrainLaunch
    from components.launchers.pytorchjob import (
        PyTorchJobOptions,
        build_pytorchjob,
        gke_accelerator,
        to_yaml,
    )
    from components.param_checks import resolve_nproc_per_node

    gpus = RunParams.accelerator_count if accelerator else 0
    launch = TrainLaunch(
        run_id=run_id,
        trainer=_trainer_config(model, data, output, None, max_steps, set_),
        nodes=nodes,
        nproc_per_node=resolve_nproc_per_node("gke", nproc_per_node, gpus),
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
    )
    options = PyTorchJobOptions(
        namespace=namespace,
        image=image or DEFAULT_IMAGE,
        accelerator=gke_accelerator(accelerator),
        cpu=cpu,
        memory=memory,
        shm_size=shm_size,
        service_account=service_account or None,
        hf_token_secret=hf_token_secret or None,
        gang_scheduling=gang_scheduling,
        active_deadline_seconds=active_deadline_seconds,
    )
    job = build_pytorchjob(launch=launch, options=options)
    typer.echo(to_yaml(job), nl=False)


@app.command(
    "preprocess",
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    },
    add_help_option=False,
)
def preprocess_cmd(ctx: typer.Context) -> None:
    """Raw records -> packed, tokenized Parquet shards + manifest.json (Beam; --help for flags).

    Example: llmft preprocess --input 'data/*.jsonl' --output out/ --tokenizer tok/ --seq-len 512
    """
    from beam_preprocess.cli import main as preprocess_main

    args = list(ctx.args)
    if any(arg.lower().endswith(".gguf") for arg in args):
        from components.steps.preprocess import resolve_gguf_tokenizer

        try:
            args = resolve_gguf_tokenizer(args)
        except ValueError as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
    code = preprocess_main(args, prog="llmft preprocess")
    if code:
        raise typer.Exit(code)


@app.command("evaluate")
@user_errors
def evaluate_cmd(
    base: Annotated[str, typer.Option(help="Base model directory or .gguf file (local or gs://).")],
    tuned: Annotated[str, typer.Option(help="Fine-tuned model directory (the trainer's model/).")],
    data: Annotated[str, typer.Option(help="Packed dataset directory (llmft preprocess).")],
    output: Annotated[
        str, typer.Option(help="Where to write metrics.json, generations.jsonl, report.html.")
    ],
    heldout: Annotated[
        str | None,
        typer.Option(help="Prompt/response JSONL for generation (default: DATA/eval_records/)."),
    ] = None,
    max_examples: Annotated[
        int, typer.Option(help="Held-out prompts to generate for (0: loss only).")
    ] = 64,
    max_eval_rows: Annotated[
        int | None, typer.Option(help="Packed eval rows to score (default: all).")
    ] = None,
    train_metrics: Annotated[
        str | None, typer.Option(help="Trainer metrics JSONL to plot.")
    ] = None,
    champion: Annotated[
        str | None, typer.Option(help="Currently registered model to compare against.")
    ] = None,
    min_loss_improvement: Annotated[
        float, typer.Option(help="Gate: base loss - tuned loss must be >= this.")
    ] = 0.0,
    min_exact_match: Annotated[
        float, typer.Option(help="Gate: tuned exact match must be >= this (0 disables).")
    ] = 0.0,
    min_general_retained: Annotated[
        float,
        typer.Option(
            help="Gate: fraction of the general probes the base answers that the tuned "
            "model must still answer (0 disables)."
        ),
    ] = 0.0,
    max_new_tokens: Annotated[int, typer.Option(help="Generation length limit.")] = 64,
    device: Annotated[
        str | None, typer.Option(help="torch device (default: cuda if present, else cpu).")
    ] = None,
    require_pass: Annotated[bool, typer.Option(help="Exit 1 when the quality gate fails.")] = False,
) -> None:
    """Compare base and fine-tuned models on the eval split: loss, exact match, chrF, HTML report."""
    import logging

    from components.evaluation.evaluate import run_evaluation

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = run_evaluation(
        base=base, tuned=tuned, data_dir=data, output_dir=output, heldout=heldout,
        max_examples=max_examples, max_eval_rows=max_eval_rows, train_metrics=train_metrics,
        champion=champion, min_loss_improvement=min_loss_improvement,
        min_exact_match=min_exact_match, min_general_retained=min_general_retained,
        max_new_tokens=max_new_tokens, device=device,
    )  # fmt: skip
    _print_json(
        {
            "passed": result.passed,
            "failures": result.decision.failures,
            "metrics": result.metrics,
            "report": result.report_path,
            "metrics_file": result.metrics_path,
        }
    )
    if require_pass and not result.passed:
        raise typer.Exit(1)


config_app = typer.Typer(help="Write deploy configs.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("from-stack")
@user_errors
def config_from_stack_cmd(
    stack_output: Annotated[
        str,
        typer.Option(help="`pulumi stack output --json` of infra/: a JSON file, or - for stdin."),
    ],
    output: Annotated[
        Path, typer.Option(help="Deploy config to write (updated in place if it exists).")
    ] = Path("deploy.yaml"),
) -> None:
    """Write the deploy config's project, region, bucket, registry and service accounts from the
    infra stack, e.g. `pulumi -C infra stack output --json | llmft config from-stack --stack-output -`."""
    import sys

    from pipelines.deploy.from_stack import parse_stack_output, write_config

    if stack_output == "-":
        outputs = parse_stack_output(sys.stdin.read(), "stdin")
    else:
        outputs = parse_stack_output(Path(stack_output).read_text(), stack_output)
    write_config(outputs, output)
    typer.echo(f"wrote {output} (project {outputs['project']}, region {outputs['region']})")
    if outputs.get("image"):
        typer.echo(f"image: {outputs['image']}", err=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
