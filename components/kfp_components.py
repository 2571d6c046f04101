"""The KFP components: one thin lightweight component per pipeline step.

Each body imports one function of this package and calls it; everything it does lives in an
importable, tested module (GCPC's habit). All components share `llmft_component`: the project
image (pinned tag, components/image.py) with the package preinstalled, so nothing is pip-installed
at run time (`install_kfp_package=False`), and `kfp.local`'s SubprocessRunner can run the same
components on one machine.

Compiled one by one to compiled/components/<name>.yaml so other pipelines can reuse them with
`kfp.components.load_component_from_file`.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output, OutputPath

from components.image import DEFAULT_IMAGE

_KFP_LAUNCH = "_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main"


def exec_python(command: list[str]) -> list[str]:
    """KFP's lightweight-component command with Python exec'd instead of run as a child.

    KFP generates `sh -ec '...; python3 -m kfp.dsl.executor_main ...'`; dash runs the last
    command as a child and does not forward SIGTERM, so cancelling a run would kill the task
    without the launcher inside ever hearing it (and cancelling its training job). With `exec`
    Python replaces the shell and receives the signal itself.
    """
    if not any(_KFP_LAUNCH in part for part in command):
        raise AssertionError(f"KFP's lightweight command changed; update exec_python: {command}")
    return [
        part.replace(_KFP_LAUNCH, _KFP_LAUNCH.replace("python3", "exec python3"))
        for part in command
    ]


def llmft_component(func):  # type: ignore[no-untyped-def]
    """`@dsl.component` on the project image (the one place the image is set), whose command
    execs Python so that SIGTERM reaches the step (`exec_python`)."""
    component = dsl.component(func, base_image=DEFAULT_IMAGE, install_kfp_package=False)
    container = component.component_spec.implementation.container
    container.command = exec_python(list(container.command))
    return component


@llmft_component
def validate_inputs(
    # Every run parameter (components/run_params.py; tests/test_validation.py keeps this list
    # equal to the schema's), plus the pipeline's target, the run's id and its schedule time.
    train_data_uri: str,
    base_model: str,
    backend: str,
    data_kind: str,
    seq_len: int,
    eval_fraction: float,
    preprocess_runner: str,
    dataflow_options: dict,
    dataflow_service_account: str,
    nodes: int,
    nproc_per_node: int,
    rdzv_backend: str,
    max_steps: int,
    learning_rate: float,
    trainer_overrides: dict,
    project: str,
    region: str,
    work_uri: str,
    namespace: str,
    gke_cluster: str,
    machine_type: str,
    accelerator_type: str,
    accelerator_count: int,
    service_account: str,
    hf_token_secret: str,
    eval_accelerator_type: str,
    eval_accelerator_count: int,
    max_eval_examples: int,
    min_loss_improvement: float,
    min_exact_match: float,
    min_general_retained: float,
    register_model: bool,
    registered_model: str,
    champion_model: str,
    serving_image: str,
    target: str,
    run_id: str,
    schedule_time: str,
) -> NamedTuple(  # type: ignore[valid-type]
    "ValidatedInputs", [("base_model", str), ("train_data_uri", str), ("champion_model", str)]
):
    """Check every run parameter before anything costly starts; resolve what a run reads.

    Returns:
        base_model: the model to start from (`latest-registered` resolved to a model URI).
        train_data_uri: the data URI with the schedule-time placeholder filled in.
        champion_model: the model to beat besides the base ("" for none).
    """
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.validation import validate_and_resolve

    return validate_and_resolve(**params)


@llmft_component
def preprocess(
    train_data_uri: str,
    base_model: str,
    data_kind: str,
    seq_len: int,
    eval_fraction: float,
    runner: str,
    project: str,
    region: str,
    work_uri: str,
    run_id: str,
    dataflow_options: dict,
    dataflow_service_account: str,
    hf_token_secret: str,
    dataset: Output[Dataset],
    summary: Output[Markdown],
    gcp_resources: OutputPath(str),  # type: ignore[valid-type]
):
    """Turn raw records into packed, tokenized Parquet shards with Apache Beam.

    Runs the Beam pipeline in-process (DirectRunner) or submits it to Dataflow and waits; the
    Dataflow job is written to `gcp_resources` so cancelling the pipeline cancels the job.
    """
    from components.artifacts import data_artifact_uri
    from components.preprocess_step import run_preprocess_component

    dataset.uri = data_artifact_uri(dataset.uri, work_uri=work_uri, run_id=run_id, name="dataset")
    dataset.metadata.update(
        run_preprocess_component(
            train_data_uri=train_data_uri,
            base_model=base_model,
            data_kind=data_kind,
            seq_len=seq_len,
            eval_fraction=eval_fraction,
            runner=runner,
            project=project,
            region=region,
            work_uri=work_uri,
            run_id=run_id,
            dataflow_options=dataflow_options,
            dataflow_service_account=dataflow_service_account,
            hf_token_secret=hf_token_secret,
            output_uri=dataset.uri,
            summary_path=summary.path,
            gcp_resources_path=gcp_resources,
        )
    )


@llmft_component
def etcd_up(
    backend: str, run_id: str, rdzv_backend: str, namespace: str, gke_cluster: str, project: str
) -> str:
    """Start this run's etcd (a local process, or a StatefulSet + ClusterIP Service on GKE).

    Returns:
        The rendezvous endpoint `host:port` ("" for c10d and on Vertex, which rendezvous at the
        primary replica).
    """
    from components.etcd_step import etcd_up as start

    return start(
        backend=backend,
        run_id=run_id,
        rdzv_backend=rdzv_backend,
        namespace=namespace,
        gke_cluster=gke_cluster,
        project=project,
    )


@llmft_component
def train(
    backend: str,
    run_id: str,
    base_model: str,
    dataset: Input[Dataset],
    rdzv_endpoint: str,
    rdzv_backend: str,
    nodes: int,
    nproc_per_node: int,
    max_steps: int,
    learning_rate: float,
    trainer_overrides: dict,
    project: str,
    region: str,
    work_uri: str,
    namespace: str,
    gke_cluster: str,
    machine_type: str,
    accelerator_type: str,
    accelerator_count: int,
    service_account: str,
    hf_token_secret: str,
    model: Output[Model],
    gcp_resources: OutputPath(str),  # type: ignore[valid-type]
):
    """Fine-tune with FSDP2 on N nodes x P processes: local torchrun agents, a PyTorchJob on GKE or
    a Vertex AI CustomJob. Exports a Hugging Face model directory as the Model artifact."""
    from components.artifacts import data_artifact_uri
    from components.train_step import run_train_component

    model.uri = data_artifact_uri(model.uri, work_uri=work_uri, run_id=run_id, name="model")
    model.metadata.update(
        run_train_component(
            backend=backend,
            run_id=run_id,
            base_model=base_model,
            data=dataset.uri,
            rdzv_endpoint=rdzv_endpoint,
            rdzv_backend=rdzv_backend,
            nodes=nodes,
            nproc_per_node=nproc_per_node,
            max_steps=max_steps,
            learning_rate=learning_rate,
            trainer_overrides=trainer_overrides,
            project=project,
            region=region,
            work_uri=work_uri,
            namespace=namespace,
            gke_cluster=gke_cluster,
            machine_type=machine_type,
            accelerator_type=accelerator_type,
            accelerator_count=accelerator_count,
            service_account=service_account,
            hf_token_secret=hf_token_secret,
            output_uri=model.uri,
            gcp_resources_path=gcp_resources,
        )
    )


@llmft_component
def evaluate(
    base_model: str,
    tuned_model: Input[Model],
    dataset: Input[Dataset],
    max_eval_examples: int,
    min_loss_improvement: float,
    min_exact_match: float,
    champion_model: str,
    min_general_retained: float,
    project: str,
    hf_token_secret: str,
    metrics: Output[Metrics],
    report: Output[HTML],
) -> NamedTuple("EvaluateOutputs", [("passed", bool)]):  # type: ignore[valid-type]
    """Evaluate the base and the tuned model on the eval split; write Metrics, an HTML report and
    the quality gate's verdict.

    Returns:
        passed: whether the tuned model meets the thresholds (and beats the champion, if given).
    """
    from components.evaluation.step import run_evaluate_component

    scalars, passed = run_evaluate_component(
        base_model=base_model,
        tuned_model_uri=tuned_model.uri,
        tuned_metadata=tuned_model.metadata,
        dataset_uri=dataset.uri,
        max_examples=max_eval_examples,
        min_loss_improvement=min_loss_improvement,
        min_exact_match=min_exact_match,
        champion_model=champion_model,
        min_general_retained=min_general_retained,
        project=project,
        hf_token_secret=hf_token_secret,
        report_path=report.path,
    )
    for name, value in scalars.items():
        metrics.log_metric(name, value)
    return (passed,)


@llmft_component
def register(
    tuned_model: Input[Model],
    run_id: str,
    project: str,
    region: str,
    registered_model: str,
    serving_image: str,
) -> str:
    """Upload the tuned model to Vertex AI Model Registry (a new version of `registered_model`).

    Returns:
        The registered model version's resource name.
    """
    from components.registry import register_model_artifact

    return register_model_artifact(
        model_uri=tuned_model.uri,
        metadata=tuned_model.metadata,
        run_id=run_id,
        project=project,
        region=region,
        registered_model=registered_model,
        serving_image=serving_image,
    )


@llmft_component
def cleanup(backend: str, run_id: str, namespace: str, gke_cluster: str, project: str, region: str):
    """Exit handler: delete everything that carries this run's label; ignore what is gone."""
    from components.cleanup_step import cleanup_run

    cleanup_run(
        backend=backend,
        run_id=run_id,
        namespace=namespace,
        gke_cluster=gke_cluster,
        project=project,
        region=region,
    )


ALL_COMPONENTS = {
    "validate_inputs": validate_inputs,
    "preprocess": preprocess,
    "etcd_up": etcd_up,
    "train": train,
    "evaluate": evaluate,
    "register": register,
    "cleanup": cleanup,
}
