"""`llmft train`, `preprocess`, `evaluate` and `render pytorchjob`: one pipeline step run by
hand, each a thin layer over the module the pipeline's component calls."""

from __future__ import annotations

from typing import Annotated

import typer

from components.params.run_params import RunParams
from components.serving.mlflow_tracking import end_failed, finish_train, open_step, run_tags
from pipelines.cli.common import not_a_file, print_json, trainer_config, user_errors
from trainer.config import TrainConfig


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
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Delete the checkpoints a previous run left in --output and start over "
            "(default: resume from them, refused when they are another run's)."
        ),
    ] = False,
    tracking_uri: TrackingUriOpt = "",
    experiment: ExperimentOpt = "",
) -> None:
    """Fine-tune on N nodes x P processes (local: torchrun agents with etcd rendezvous)."""
    import dataclasses
    import uuid

    from components.launchers.base import LaunchCancelled, LaunchFailed, TrainLaunch
    from components.launchers.local import LocalOptions
    from components.params.param_checks import resolve_nproc_per_node
    from components.steps.train import train

    if backend != "local":
        raise ValueError(
            f"--backend {backend}: `llmft train` runs locally; use `llmft run --backend {backend}` "
            "(the pipeline) or `llmft render pytorchjob` for GKE"
        )
    not_a_file(output, "--output")
    check_tracking_uri(tracking_uri)
    trainer = trainer_config(model, data, output, config, max_steps, set_)
    run_id = run_id or f"local-{uuid.uuid4().hex[:10]}"
    tags = run_tags(base_model=model, backend="local", dataset_uri=data)
    tracked, mlflow_run = open_step(tracking_uri, run_id, "train", experiment=experiment, tags=tags)
    if mlflow_run:
        trainer = dataclasses.replace(
            trainer, tracking_uri=tracking_uri, tracking_run_id=mlflow_run
        )
    try:
        launch = TrainLaunch(
            run_id=run_id,
            trainer=trainer,
            nodes=nodes,
            nproc_per_node=resolve_nproc_per_node("local", nproc_per_node, 0),
            rdzv_backend=rdzv_backend,
            rdzv_endpoint=rdzv_endpoint,
            max_restarts=max_restarts,
        )
        metadata = train(launch, LocalOptions(), overwrite=overwrite)
    except LaunchFailed as exc:
        end_failed(tracked, mlflow_run)
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(130 if isinstance(exc, LaunchCancelled) else 1) from None
    except BaseException:
        end_failed(tracked, mlflow_run)
        raise
    params = {"backend": "local", "base_model": model, "nodes": nodes, "max_steps": max_steps}
    finish_train(tracked, mlflow_run, params=params, metadata=metadata, run_dir=output)
    print_json(metadata)


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
    active_deadline_seconds: DeadlineOpt = None,
    set_: SetOpt = None,
) -> None:
    """Print the PyTorchJob (Kubeflow Training Operator v1) a GKE run would create, as YAML."""
    from components.launchers.base import TrainLaunch
    from components.launchers.pytorchjob import PyTorchJobOptions, build_pytorchjob, to_yaml
    from components.params.param_checks import resolve_nproc_per_node
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
        active_deadline_seconds=active_deadline_seconds,
    )
    job = build_pytorchjob(launch=launch, options=options)
    typer.echo(to_yaml(job), nl=False)


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
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Replace metrics.json, generations.jsonl and report.html in --output even "
            "when no llmft evaluation wrote them."
        ),
    ] = False,
    eval_tasks: Annotated[
        str,
        typer.Option(help="lm-evaluation-harness tasks, comma-separated (e.g. mmlu,arc_easy)."),
    ] = "",
    num_fewshot: Annotated[
        int, typer.Option(help="Few-shot examples per harness prompt (-1: task default).")
    ] = -1,
    limit: Annotated[int, typer.Option(help="Documents per harness task (0: all).")] = 0,
    max_task_regression: Annotated[
        float,
        typer.Option(help="Gate: tuned may score at most this many points below base per task."),
    ] = 100.0,
    accelerator_type: Annotated[
        str,
        typer.Option(
            help="Evaluation GPU (e.g. NVIDIA_L4) to check the models fit (default: measured)."
        ),
    ] = "",
    accelerator_count: Annotated[int, typer.Option(help="GPUs of --accelerator-type.")] = 1,
    objective: Annotated[
        str,
        typer.Option(
            help="What --tuned was trained for: sft, or dpo (a preference dataset: win rate and "
            "reward margin of the held-out pairs, base as reference)."
        ),
    ] = TrainConfig.objective,
    dpo_beta: Annotated[
        float, typer.Option(help="DPO's beta as trained with (scales the implicit rewards).")
    ] = TrainConfig.dpo_beta,
    quantize_base: Annotated[
        str,
        typer.Option(
            help="The run's quantize_base (its summary.json): nf4 makes DPO's reference the "
            "base through NF4 and back, as the trainer's was."
        ),
    ] = TrainConfig.quantize_base,
    compute_dtype: Annotated[
        str,
        typer.Option(
            help="The trainer's compute dtype (summary.json's compute_dtype: bf16 or fp32) an "
            "NF4 reference is de-quantized to; auto: bf16 on CUDA, else fp32."
        ),
    ] = TrainConfig.dtype,
    tracking_uri: TrackingUriOpt = "",
    experiment: ExperimentOpt = "",
    run_id: Annotated[
        str, typer.Option(help="With --tracking-uri: the run (llmft train --run-id) to log to.")
    ] = "",
    registered_model: Annotated[
        str,
        typer.Option(help="MLflow registered model a passing model becomes a version of."),
    ] = "",
) -> None:
    """Compare base and fine-tuned models on the eval split: loss, exact match, chrF, standard
    tasks (lm-evaluation-harness), DPO win rate, HTML report."""
    import logging

    from components.evaluation.evaluate import EvaluationRequest, run_evaluation
    from components.evaluation.gate import GateThresholds

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from components.serving.mlflow_tracking import finish_evaluate
    from components.steps.evaluate import harness_settings

    check_tracking_uri(tracking_uri)
    if tracking_uri and not run_id:
        raise ValueError("--tracking-uri needs --run-id (the run `llmft train` logged)")

    thresholds = GateThresholds(
        min_loss_improvement=min_loss_improvement,
        min_exact_match=min_exact_match,
        min_general_retained=min_general_retained,
        max_task_regression=max_task_regression,
    )
    request = EvaluationRequest(
        base=base, tuned=tuned, data_dir=data, output_dir=output, heldout=heldout,
        max_examples=max_examples, max_eval_rows=max_eval_rows, train_metrics=train_metrics,
        champion=champion, thresholds=thresholds, max_new_tokens=max_new_tokens, device=device,
        overwrite=overwrite,
        harness=harness_settings(eval_tasks, num_fewshot, limit),
        accelerator_type=accelerator_type, accelerator_count=accelerator_count,
        objective=objective, dpo_beta=dpo_beta, quantize_base=quantize_base,
        compute_dtype=compute_dtype,
    )  # fmt: skip
    tags = run_tags(base_model=base, backend="local", dataset_uri=data)
    tracked, mlflow_run = open_step(
        tracking_uri, run_id, "evaluate", experiment=experiment, tags=tags
    )
    try:
        result = run_evaluation(request)
    except BaseException:
        end_failed(tracked, mlflow_run)
        raise
    finish_evaluate(
        tracked,
        mlflow_run,
        result=result,
        model_uri=tuned,
        registered_model=registered_model,
        base_model=base,
    )
    print_json(
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
    from components.runtime.run_identity import state_root
    from components.steps.cleanup import CleanupRequest, local_runs_by_liveness, run

    root = str(state_root(state_dir))
    runs: list[str] = [run_id] if run_id is not None else []
    live: list[str] = []
    if run_id is None:
        runs, live = local_runs_by_liveness(root)
    for name in runs:
        removed = run(CleanupRequest(backend="local", run_id=name, state_root=root))
        for line in removed or [f"nothing left of run {name}"]:
            typer.echo(line)
    for name in live:
        typer.echo(f"run {name} is still running: pass --run-id {name} to stop it anyway")
    if not runs and not live:
        typer.echo(f"no local runs under {root}")
