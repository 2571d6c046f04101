"""The KFP components: one thin lightweight component per pipeline step.

Each body takes its parameters, exactly, as one frozen request of its step module
(components/steps/<step>.py) and calls that module's `run`; everything a step does lives there, in
an importable, tested module (GCPC's habit), and its request's fields have the component's
parameter names. All components share `llmft_component`: the project
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
    "ValidatedInputs", [("base_model", str), ("train_data_uri", str), ("champion_model", str)]
):
    """Check every run parameter before anything costly starts; resolve what a run reads.

    Returns:
        base_model: the model to start from (`latest-registered` resolved to a model URI).
        train_data_uri: the data URI with the schedule-time placeholder filled in.
        champion_model: the model to beat besides the base ("" for none).
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
    dataset: Output[Dataset],
    summary: Output[Markdown],
    gcp_resources: OutputPath(str),  # type: ignore[valid-type]
):
    """Turn raw records into packed, tokenized Parquet shards with Apache Beam.

    Runs the Beam pipeline in-process (DirectRunner) or submits it to Dataflow and waits; the
    Dataflow job is written to `gcp_resources` so cancelling the pipeline cancels the job.
    """
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.preprocess import PreprocessRequest, run

    run(PreprocessRequest(**params))


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
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.train import TrainRequest, run

    run(TrainRequest(**params))


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
) -> NamedTuple("EvaluateOutputs", [("passed", bool)]):  # type: ignore[valid-type]
    """Evaluate the base and the tuned model on the eval split; write Metrics, an HTML report and
    the quality gate's verdict.

    Returns:
        passed: whether the tuned model meets the thresholds (and beats the champion, if given).
    """
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.evaluate import EvaluateRequest, run

    return run(EvaluateRequest(**params))


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
    params = dict(locals())  # exactly the parameters: taken before anything else is bound
    from components.steps.register import RegisterRequest, run

    return run(RegisterRequest(**params))


@llmft_component
def cleanup(backend: str, run_id: str, namespace: str, gke_cluster: str, project: str, region: str):
    """Exit handler: delete everything that carries this run's label; ignore what is gone."""
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
    "cleanup": cleanup,
}
