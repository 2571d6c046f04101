"""The KFP components: one thin lightweight component per pipeline step.

Each body takes its parameters, exactly, as one frozen request of its step module
(components/steps/<step>.py) and calls that module's `run`; everything a step does lives there, in
an importable, tested module (GCPC's habit), and its request's fields have the component's
parameter names. All components share `llmft_component`: the project
image (pinned tag, components/runtime/image.py) with the package preinstalled, so nothing is pip-installed
at run time (`install_kfp_package=False`), and `kfp.local`'s SubprocessRunner can run the same
components on one machine.

Compiled one by one to compiled/components/<name>.yaml so other pipelines can reuse them with
`kfp.components.load_component_from_file`.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output, OutputPath

from components.runtime.image import DEFAULT_IMAGE
from components.serving.lineage import VertexModel

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
    # Every run parameter (components/params/run_params.py; tests/test_validation.py keeps this list
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
    record_format: str,
    prompt_field: str,
    response_field: str,
    messages_field: str,
    text_field: str,
    system_field: str,
    tool_turns: str,
    chat_template: str,
    bigquery_query: str,
    nodes: int,
    nproc_per_node: int,
    rdzv_backend: str,
    max_steps: int,
    learning_rate: float,
    trainer_overrides: dict,
    quantize_base: str,
    objective: str,
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
    serving_preset: str,
    lora_serving: str,
    deploy_endpoint: str,
    deploy_machine_type: str,
    deploy_accelerator_type: str,
    deploy_accelerator_count: int,
    deploy_spot: bool,
    deploy_traffic_percent: int,
    tensorboard: str,
    experiment: str,
    encryption_key: str,
    train_timeout_s: int,
    capacity: str,
    max_cost_usd: float,
    max_wait_minutes: int,
    reservation: str,
    gpu_hour_price_usd: float,
    model_parameters: int,
    # evaluation: standard tasks and judge (issue 31)
    eval_tasks: str,
    eval_num_fewshot: int,
    eval_limit: int,
    max_task_regression: float,
    judge_metric: str,
    judge_min_win_rate: float,
    target: str,
    run_id: str,
    schedule_time: str,
) -> NamedTuple(  # type: ignore[valid-type]
    "ValidatedInputs",
    [
        ("base_model", str),
        ("train_data_uri", str),
        ("champion_model", str),
        ("budget_timeout_s", int),
        ("cost_estimate", dict),
    ],
):
    """Check every run parameter before anything costly starts; resolve what a run reads;
    estimate the run's cost and refuse it over max_cost_usd.

    Returns:
        base_model: the model to start from (`latest-registered` resolved to a model URI).
        train_data_uri: the data URI with the schedule-time placeholder filled in.
        champion_model: the model to beat besides the base ("" for none).
        budget_timeout_s: the training job's timeout that keeps it within max_cost_usd (0: none).
        cost_estimate: expected GPU-hours, wall hours and USD per pipeline step.
    """
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.validate import ValidateRequest, run

    return run(ValidateRequest(**params))


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
    record_format: str,
    prompt_field: str,
    response_field: str,
    messages_field: str,
    text_field: str,
    system_field: str,
    tool_turns: str,
    chat_template: str,
    bigquery_query: str,
    dataset: Output[Dataset],
    summary: Output[Markdown],
    gcp_resources: OutputPath(str),  # type: ignore[valid-type]
) -> NamedTuple("PreprocessOutputs", [("dataset_uri", str)]):  # type: ignore[valid-type]
    """Turn raw records into packed, tokenized Parquet shards with Apache Beam.

    Runs the Beam pipeline in-process (DirectRunner) or submits it to Dataflow and waits; the
    Dataflow job is written to `gcp_resources` (the console's link to it); cancelling the
    pipeline cancels the job through this step's SIGTERM handler.

    Returns:
        dataset_uri: the Dataset artifact's URI, for steps that only pass it on (a string is
            not downloaded into their pod the way an input artifact is).
    """
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.preprocess import PreprocessRequest, run

    return run(PreprocessRequest(**params))


@llmft_component
def etcd_up(
    backend: str, run_id: str, rdzv_backend: str, namespace: str, gke_cluster: str, project: str
) -> str:
    """Start this run's etcd (a local process, or a StatefulSet + ClusterIP Service on GKE).

    Returns:
        The rendezvous endpoint `host:port` ("" for c10d and on Vertex, which rendezvous at the
        primary replica).
    """
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.etcd import EtcdRequest, run

    return run(EtcdRequest(**params))


@llmft_component
def train(
    backend: str,
    run_id: str,
    base_model: str,
    dataset_uri: str,
    rdzv_endpoint: str,
    rdzv_backend: str,
    nodes: int,
    nproc_per_node: int,
    max_steps: int,
    learning_rate: float,
    trainer_overrides: dict,
    quantize_base: str,
    objective: str,
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
    train_timeout_s: int,
    capacity: str,
    max_wait_minutes: int,
    reservation: str,
    gpu_hour_price_usd: float,
    budget_timeout_s: int,
    tensorboard: str,
    experiment: str,
    encryption_key: str,
    model: Output[Model],
    gcp_resources: OutputPath(str),  # type: ignore[valid-type]
) -> NamedTuple("TrainOutputs", [("model_uri", str)]):  # type: ignore[valid-type]
    """Fine-tune with FSDP2 on N nodes x P processes: local torchrun agents, a PyTorchJob on GKE or
    a Vertex AI CustomJob. Exports a Hugging Face model directory as the Model artifact.

    The dataset comes by URI (the workers read it; an input artifact would first be downloaded
    into this small launcher pod).

    Returns:
        model_uri: where the exported Hugging Face model is (the Model artifact's files).
    """
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.train import TrainRequest, run

    return run(TrainRequest(**params))


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
    region: str,
    eval_accelerator_type: str,
    eval_accelerator_count: int,
    eval_tasks: str,
    eval_num_fewshot: int,
    eval_limit: int,
    max_task_regression: float,
    judge_metric: str,
    judge_min_win_rate: float,
    objective: str,
) -> NamedTuple("EvaluateOutputs", [("passed", bool)]):  # type: ignore[valid-type]
    """Evaluate the base and the tuned model on the eval split; write Metrics, an HTML report and
    the quality gate's verdict (objective=dpo: with the win rate on the held-out pairs).

    Returns:
        passed: whether the tuned model meets the thresholds (and beats the champion, if given).
    """
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.evaluate import EvaluateRequest, run

    return run(EvaluateRequest(**params))


@llmft_component
def register(
    model_uri: str,
    base_model: str,
    metrics: Input[Metrics],
    run_id: str,
    project: str,
    region: str,
    registered_model: str,
    serving_image: str,
    serving_preset: str,
    lora_serving: str,
    seq_len: int,
    deploy_accelerator_count: int,
    vertex_model: Output[VertexModel],
) -> str:
    """Upload the tuned model to Vertex AI Model Registry (a new version of `registered_model`)
    with the serving preset's container, attach the gate's metrics as its model evaluation and
    move the `champion` alias to it.

    The model comes by URI: the registry reads it from gs://; an input artifact would first be
    downloaded whole into this small pod.

    Returns:
        The registered model version's resource name (also the `google.VertexModel` output that
        GCPC's deploy and batch-prediction components take).
    """
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.register import RegisterRequest, run

    return run(RegisterRequest(**params))


@llmft_component
def deploy(
    model_uri: str,
    run_id: str,
    project: str,
    region: str,
    serving_preset: str,
    deploy_endpoint: str,
    deploy_machine_type: str,
    deploy_accelerator_type: str,
    deploy_accelerator_count: int,
    deploy_spot: bool,
    deploy_traffic_percent: int,
    encryption_key: str,
    local: bool,
    vertex_model: Input[VertexModel] = None,
    gate_passed: bool = True,
) -> NamedTuple("DeployOutputs", [("endpoint", str), ("answer", str)]):  # type: ignore[valid-type]
    """Deploy the registered version to a Vertex AI endpoint (or, in a local run, serve the model
    on this machine) and send it a smoke chat prompt; fail when it does not answer.

    Returns:
        endpoint: the endpoint's resource name (locally: the server's chat URL).
        answer: the model's answer to the smoke prompt.
    """
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.deploy import DeployRequest, run

    return run(DeployRequest(**params))


@llmft_component
def cleanup(
    backend: str,
    run_id: str,
    namespace: str,
    gke_cluster: str,
    project: str,
    region: str,
    status: dsl.PipelineTaskFinalStatus,
):
    """Exit handler: delete everything that carries this run's label; ignore what is gone. A
    failed or cancelled run's deployments to Vertex AI endpoints are undeployed."""
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.cleanup import CleanupRequest, run

    run(CleanupRequest(**params))


ALL_COMPONENTS = {
    "validate_inputs": validate_inputs,
    "preprocess": preprocess,
    "etcd_up": etcd_up,
    "train": train,
    "evaluate": evaluate,
    "register": register,
    "deploy": deploy,
    "cleanup": cleanup,
}
