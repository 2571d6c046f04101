"""`llmft train`, `preprocess`, `render pytorchjob|trainjob` and `cleanup`: one pipeline step run by
hand, each a thin layer over the module the pipeline's component calls (`evaluate`: evaluate.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

import typer

from components.launchers.base import LaunchCancelled, LaunchFailed, TrainLaunch
from components.params.run_params import RunParams
from components.runtime.run_identity import state_root
from components.serving.mlflow_tracking import end_failed, finish_train, open_step, run_tags
from pipelines.cli.common import not_a_file, print_json, trainer_config, user_errors

# lazy imports: each command imports the modules of its work in its body, so that `llmft --help`
# (0.4 s) does not pay for them: the launcher, step and Beam CLI modules take +3.7 s to import
# after pipelines.cli (min of 3, shared 2-core machine).

ModelOpt = Annotated[
    str, typer.Option(help="Base model: HF save_pretrained directory or .gguf file.")
]
DataOpt = Annotated[str, typer.Option(help="Packed dataset directory (llmft preprocess).")]
RunDirOpt = Annotated[
    str, typer.Option("--output", help="Run directory: model/, metrics.jsonl, summary.json, logs/.")
]
BackendOpt = Annotated[str, typer.Option(help="Where to run: local (torchrun agents here).")]
NodesOpt = Annotated[int, typer.Option(help="Nodes: separate torchrun agents.")]
NprocOpt = Annotated[int, typer.Option(help="Worker processes per node (0: one).")]
MaxStepsOpt = Annotated[
    int | None, typer.Option(help="Optimizer steps (default: the trainer's `epochs`).")
]
LocalRdzvEndpointOpt = Annotated[
    str, typer.Option(help="host:port; empty starts a local etcd for the run (c10d: a free port).")
]
LocalRunIdOpt = Annotated[str | None, typer.Option(help="Run id (default: generated).")]
TrainerYamlOpt = Annotated[
    str | None, typer.Option(help="Trainer YAML config (--config of the trainer).")
]
MaxRestartsOpt = Annotated[int, typer.Option(help="torchrun restarts after a worker failure.")]
OverwriteRunOpt = Annotated[
    bool,
    typer.Option(
        help="Delete the checkpoints a previous run left in --output and start over "
        "(default: resume from them, refused when they are another run's)."
    ),
]


@user_errors
def train_cmd(
    model: ModelOpt,
    data: DataOpt,
    output: RunDirOpt,
    backend: BackendOpt = "local",
    nodes: NodesOpt = RunParams.nodes,
    nproc_per_node: NprocOpt = RunParams.nproc_per_node,
    max_steps: MaxStepsOpt = None,
    rdzv_backend: RdzvBackendOpt = RunParams.rdzv_backend,
    rdzv_endpoint: LocalRdzvEndpointOpt = "",
    run_id: LocalRunIdOpt = None,
    config: TrainerYamlOpt = None,
    max_restarts: MaxRestartsOpt = 0,
    set_: SetOpt = None,
    overwrite: OverwriteRunOpt = False,
    tracking_uri: TrackingUriOpt = "",
    experiment: ExperimentOpt = "",
) -> None:
    """Fine-tune on N nodes x P processes (local: torchrun agents with etcd rendezvous)."""
    import uuid

    from components.launchers.vocab import resolve_nproc_per_node

    if backend != "local":
        raise ValueError(
            f"--backend {backend}: `llmft train` runs locally; use `llmft run --backend {backend}` "
            "(the pipeline) or `llmft render pytorchjob` for GKE"
        )
    not_a_file(output, "--output")
    check_tracking_uri(tracking_uri)
    run_id = run_id or f"local-{uuid.uuid4().hex[:10]}"
    launch = TrainLaunch(
        run_id=run_id,
        trainer=trainer_config(model, data, output, config, max_steps, set_),
        nodes=nodes,
        nproc_per_node=resolve_nproc_per_node("local", nproc_per_node, 0),
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        max_restarts=max_restarts,
    )
    metadata = _train_tracked(launch, overwrite, tracking_uri=tracking_uri, experiment=experiment)
    print_json(metadata)


def _train_tracked(
    launch: TrainLaunch, overwrite: bool, *, tracking_uri: str, experiment: str
) -> dict[str, Any]:
    """Run `launch` here, in an MLflow run when `tracking_uri` is set (ended as failed when the
    launch fails); a failed or cancelled launch is one `error:` line and exit 1 (130)."""
    import dataclasses

    from components.launchers.local import LocalOptions
    from components.steps.train import train

    trainer = launch.trainer
    tags = run_tags(base_model=trainer.model, backend="local", dataset_uri=trainer.data)
    tracked, mlflow_run = open_step(
        tracking_uri, launch.run_id, "train", experiment=experiment, tags=tags
    )
    if mlflow_run:
        trainer = dataclasses.replace(
            trainer, tracking_uri=tracking_uri, tracking_run_id=mlflow_run
        )
        launch = dataclasses.replace(launch, trainer=trainer)
    try:
        metadata = train(launch, LocalOptions(), overwrite=overwrite)
    except LaunchFailed as exc:
        end_failed(tracked, mlflow_run)
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(130 if isinstance(exc, LaunchCancelled) else 1) from None
    except BaseException:
        end_failed(tracked, mlflow_run)
        raise
    params = {
        "backend": "local",
        "base_model": trainer.model,
        "nodes": launch.nodes,
        "max_steps": trainer.max_steps,
    }
    finish_train(tracked, mlflow_run, params=params, metadata=metadata, run_dir=trainer.output)
    return metadata


def check_tracking_uri(uri: str) -> None:
    """--tracking-uri as the pipeline's validate step checks tracking_uri (exit 2 when wrong)."""
    from trainer.tracking import tracking_uri_problem

    if problem := tracking_uri_problem(uri):
        raise ValueError(problem)


TrackingUriOpt = Annotated[
    str,
    typer.Option(
        help="MLflow tracking: http(s)://server (its token in $MLFLOW_TRACKING_TOKEN), or a "
        "local file:/sqlite: store ('' for none)."
    ),
]
ExperimentOpt = Annotated[str, typer.Option(help="MLflow experiment (default: llmft).")]

# `llmft render pytorchjob`'s longer options.
PodModelOpt = Annotated[str, typer.Option(help="Base model URI as the pods see it.")]
PodDataOpt = Annotated[str, typer.Option(help="Packed dataset URI.")]
PodOutputOpt = Annotated[str, typer.Option(help="Run directory URI.")]
JobRunIdOpt = Annotated[str, typer.Option(help="Run id (names, labels, rendezvous id).")]
PodProcsOpt = Annotated[
    int,
    typer.Option(
        help=f"Processes (GPUs) per pod; 0: one per GPU ({RunParams.accelerator_count} with "
        "an accelerator, else 1)."
    ),
]
RdzvBackendOpt = Annotated[str, typer.Option(help="etcd-v3 | etcd-v2 | c10d.")]
RdzvEndpointOpt = Annotated[str, typer.Option(help="host:port (default: the run's etcd Service).")]
AcceleratorOpt = Annotated[
    str, typer.Option(help="Vertex accelerator name or GKE accelerator label; '' for CPU.")
]
PodAccountOpt = Annotated[
    str, typer.Option(help="Workload Identity KSA ('' for the namespace's default).")
]
TokenSecretOpt = Annotated[
    str, typer.Option(help="Secret with the HF token (name[:key]; '' for none).")
]
GangOpt = Annotated[bool, typer.Option(help="All pods or none (needs a gang scheduler).")]
QueueOpt = Annotated[
    str, typer.Option(help="Kueue LocalQueue that admits the job whole ('' for none).")
]
DeadlineOpt = Annotated[int | None, typer.Option(help="Hard run-time limit.")]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="Trainer field KEY=VALUE (repeatable).")
]


@user_errors
def render_pytorchjob(
    model: PodModelOpt = "gs://BUCKET/models/base",
    data: PodDataOpt = "gs://BUCKET/runs/RUN/dataset",
    output: PodOutputOpt = "gs://BUCKET/runs/RUN/train",
    run_id: JobRunIdOpt = "example-run",
    namespace: Annotated[str, typer.Option(help="Kubernetes namespace.")] = RunParams.namespace,
    nodes: Annotated[int, typer.Option(help="Worker pods.")] = RunParams.nodes,
    nproc_per_node: PodProcsOpt = RunParams.nproc_per_node,
    rdzv_backend: RdzvBackendOpt = RunParams.rdzv_backend,
    rdzv_endpoint: RdzvEndpointOpt = "",
    max_steps: Annotated[int | None, typer.Option(help="Optimizer steps.")] = None,
    image: Annotated[str | None, typer.Option(help="Image (default: the project image).")] = None,
    accelerator: AcceleratorOpt = RunParams.accelerator_type,
    cpu: Annotated[str | None, typer.Option(help="CPU per pod.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory per pod.")] = None,
    shm_size: Annotated[str, typer.Option(help="/dev/shm size.")] = "64Gi",
    service_account: PodAccountOpt = RunParams.service_account,
    hf_token_secret: TokenSecretOpt = RunParams.hf_token_secret,
    gang_scheduling: GangOpt = False,
    kueue_queue: QueueOpt = "",
    active_deadline_seconds: DeadlineOpt = None,
    set_: SetOpt = None,
) -> None:
    """Print the PyTorchJob (Kubeflow Training Operator v1) a GKE run would create, as YAML."""
    from components.launchers.k8s_yaml import to_yaml
    from components.launchers.pytorchjob import build_pytorchjob

    launch, options = _render_inputs(
        model=model,
        data=data,
        output=output,
        run_id=run_id,
        namespace=namespace,
        nodes=nodes,
        nproc_per_node=nproc_per_node,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        max_steps=max_steps,
        image=image,
        accelerator=accelerator,
        cpu=cpu,
        memory=memory,
        shm_size=shm_size,
        service_account=service_account,
        hf_token_secret=hf_token_secret,
        kueue_queue=kueue_queue,
        active_deadline_seconds=active_deadline_seconds,
        set_=set_,
        gang_scheduling=gang_scheduling,
    )
    job = build_pytorchjob(launch=launch, options=options)
    typer.echo(to_yaml(job), nl=False)


@user_errors
def render_trainjob(
    model: PodModelOpt = "gs://BUCKET/models/base",
    data: PodDataOpt = "gs://BUCKET/runs/RUN/dataset",
    output: PodOutputOpt = "gs://BUCKET/runs/RUN/train",
    run_id: JobRunIdOpt = "example-run",
    namespace: Annotated[str, typer.Option(help="Kubernetes namespace.")] = RunParams.namespace,
    nodes: Annotated[int, typer.Option(help="Node pods.")] = RunParams.nodes,
    nproc_per_node: PodProcsOpt = RunParams.nproc_per_node,
    rdzv_backend: RdzvBackendOpt = RunParams.rdzv_backend,
    rdzv_endpoint: RdzvEndpointOpt = "",
    max_steps: Annotated[int | None, typer.Option(help="Optimizer steps.")] = None,
    image: Annotated[str | None, typer.Option(help="Image (default: the project image).")] = None,
    accelerator: AcceleratorOpt = RunParams.accelerator_type,
    cpu: Annotated[str | None, typer.Option(help="CPU per pod.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory per pod.")] = None,
    shm_size: Annotated[str, typer.Option(help="/dev/shm size.")] = "64Gi",
    service_account: PodAccountOpt = RunParams.service_account,
    hf_token_secret: TokenSecretOpt = RunParams.hf_token_secret,
    kueue_queue: QueueOpt = "",
    active_deadline_seconds: DeadlineOpt = None,
    set_: SetOpt = None,
    runtimes: Annotated[
        bool, typer.Option(help="Print the ClusterTrainingRuntimes it references instead.")
    ] = False,
    gpudirect: Annotated[
        str,
        typer.Option(
            help="GPUDirect setup of the pool: gpudirect-tcpx, gpudirect-tcpxo or gpudirect-rdma "
            "(the job references that runtime variant; with --runtimes, print the variants too)."
        ),
    ] = "",
) -> None:
    """Print the TrainJob (Kubeflow Trainer v2) a GKE run would create, as YAML; `--runtimes`:
    the ClusterTrainingRuntimes infra installs for it (docs/deploy/trainjob-runtimes.yaml; with
    `--gpudirect`, also the variants a GPUDirect pool's jobs reference)."""
    from components.launchers.k8s_yaml import to_yaml
    from components.launchers.trainjob import (
        build_cluster_training_runtime,
        build_trainjob,
        runtime_restarts,
    )

    if runtimes:
        docs = [
            build_cluster_training_runtime(restarts=r, gpudirect=setup)
            for setup in dict.fromkeys((None, gpudirect or None))
            for r in runtime_restarts()
        ]
        typer.echo("---\n".join(to_yaml(doc) for doc in docs), nl=False)
        return
    launch, options = _render_inputs(
        model=model,
        data=data,
        output=output,
        run_id=run_id,
        namespace=namespace,
        nodes=nodes,
        nproc_per_node=nproc_per_node,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        max_steps=max_steps,
        image=image,
        accelerator=accelerator,
        cpu=cpu,
        memory=memory,
        shm_size=shm_size,
        service_account=service_account,
        hf_token_secret=hf_token_secret,
        kueue_queue=kueue_queue,
        active_deadline_seconds=active_deadline_seconds,
        set_=set_,
    )
    options = replace(options, gpudirect=gpudirect or None)
    typer.echo(to_yaml(build_trainjob(launch=launch, options=options)), nl=False)


def _render_inputs(
    *,
    model: Any,
    data: Any,
    output: Any,
    run_id: Any,
    namespace: Any,
    nodes: Any,
    nproc_per_node: Any,
    rdzv_backend: Any,
    rdzv_endpoint: Any,
    max_steps: Any,
    image: Any,
    accelerator: Any,
    cpu: Any,
    memory: Any,
    shm_size: Any,
    service_account: Any,
    hf_token_secret: Any,
    kueue_queue: Any,
    active_deadline_seconds: Any,
    set_: Any,
    gang_scheduling: bool = False,
) -> tuple[Any, Any]:
    """The `TrainLaunch` and `PyTorchJobOptions` of a `render pytorchjob|trainjob` command."""
    from components.launchers.base import TrainLaunch
    from components.launchers.pytorchjob import PyTorchJobOptions
    from components.launchers.vocab import resolve_nproc_per_node
    from components.platform.platform_facts import gke_accelerator
    from components.runtime.image import DEFAULT_IMAGE

    gpus = RunParams.accelerator_count if accelerator else 0
    launch = TrainLaunch(
        run_id=run_id,
        trainer=trainer_config(model, data, output, None, max_steps, set_),
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
        kueue_queue=kueue_queue or None,
        active_deadline_seconds=active_deadline_seconds,
    )
    return launch, options


def preprocess_cmd(ctx: typer.Context) -> None:
    """Raw records -> packed, tokenized Parquet shards + manifest.json (Beam; --help for flags).

    Example: llmft preprocess --input 'data/*.jsonl' --output out/ --tokenizer tok/ --seq-len 512
    """
    from beam_preprocess.cli import main as preprocess_main

    args = list(ctx.args)
    from components.steps.preprocess import resolve_tokenizer

    try:  # a GGUF file, or a hub id for Dataflow workers: a directory they can read
        args = resolve_tokenizer(args)
    except ValueError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    code = preprocess_main(args, prog="llmft preprocess")
    if code:
        raise typer.Exit(code)


@user_errors
def cleanup_cmd(
    run_id: Annotated[
        str | None,
        typer.Option(help="The local run to remove, running or not (default: every dead run)."),
    ] = None,
    state_dir: Annotated[
        str | None,
        typer.Option(
            help="State root of the runs ($LLMFT_STATE_DIR, else <tmp>/llmft-runs; a local "
            "pipeline run's is <workdir>/state)."
        ),
    ] = None,
) -> None:
    """Remove what a local run left: its processes (torchrun agents, trainers, etcd), the ports
    they held, its etcd data dir and its state. Without --run-id: every run whose launcher is gone."""
    from components.params.step_params import for_step
    from components.steps.cleanup import CleanupRequest, local_runs_by_liveness, run

    root = str(state_root(state_dir))
    runs: list[str] = [run_id] if run_id is not None else []
    live: list[str] = []
    if run_id is None:
        runs, live = local_runs_by_liveness(root)
    for name in runs:
        removed = run(
            CleanupRequest(
                params=for_step("cleanup", backend="local"), run_id=name, state_root=root
            )
        )
        for line in removed or [f"nothing left of run {name}"]:
            typer.echo(line)
    for name in live:
        typer.echo(f"run {name} is still running: pass --run-id {name} to stop it anyway")
    if not runs and not live:
        typer.echo(f"no local runs under {root}")
