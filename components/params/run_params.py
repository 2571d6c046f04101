"""The fine-tune pipeline's run parameters: the one place each name, type, choice, default, rule
and description lives.

Everything else is derived from `RunParams`:
- the `fine_tune` pipeline's signature and the parameter descriptions the Vertex AI / KFP console
  shows (pipelines/pipeline_interface.py);
- the checks of the pipeline's first step and of `llmft run` / `llmft schedule` (`RunParams.errors`,
  with the named checks of components/params/param_checks.py), which report every problem at once;
- the keys `--param KEY=VALUE` and a config file's `parameters:` accept, with their types
  (components/params/param_values.py);
- the defaults of a local run (pipelines/local_run.py) and of `llmft render pytorchjob`.

Adding a parameter is one field below, with `param(default, description, rules...)`, plus passing it
to the step that uses it. Rules that involve several fields are named checks in
components/params/param_checks.py, which `RunParams.errors` calls.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Literal

from beam_preprocess.data_shape import DataShape
from components.launchers.vocab import (
    DEFAULT_ACCELERATOR_COUNT,
    DEFAULT_ACCELERATOR_TYPE,
    DEFAULT_JOB_API,
    DEFAULT_MACHINE_TYPE,
    DEFAULT_NAMESPACE,
    DEFAULT_RDZV_BACKEND,
    DEFAULT_REGION,
    K8S_LABEL_NAME,
    PROJECT_ID,
    REGION,
    Backend,
    JobApi,
    RdzvBackend,
)
from components.params.evaluation_params import EvaluationParams
from components.params.param_schema import literal_choices, param
from components.params.serving_params import LATEST_REGISTERED, ServingParams
from components.params.target_defaults import TARGET_DEFAULTS
from components.platform.capacity import Capacity
from trainer.config import TrainConfig
from trainer.packed_data.format import (
    EVAL_FRACTION_DEFAULT,
    EVAL_FRACTION_MAX,
    SEQ_LEN_MAX,
    SEQ_LEN_MIN,
)

Runner = Literal["DirectRunner", "DataflowRunner"]
QuantizeBase = Literal["none", "nf4"]
Objective = Literal["sft", "dpo", "grpo"]
SCHEDULE_TIME_PLACEHOLDER = "{{$.pipeline_job_schedule_time_utc}}"
"""KFP's schedule-time placeholder (`dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER`), written
literally in `train_data_uri` by scheduled runs; the first step fills it in."""

TRAIN_TIMEOUT_MAX_S = 7 * 24 * 3600 - 3600
"""The longest `train_timeout_s`: an hour under 7 days (Vertex's own CustomJob default timeout),
so that the jobs' deadline (this plus a short grace) stays within it; the KFP target bounds the
train task a little above the jobs' deadline (pipelines/fine_tune.py)."""


@dataclass(frozen=True)
class RunParams(ServingParams, EvaluationParams, DataShape):
    """Every parameter of one fine-tune run (the `fine_tune` pipeline's inputs), by section: the
    data settings preprocessing defines (`DataShape`: data_kind, record_format, the field names,
    tool_turns, chat_template, bigquery_query), the evaluation and its quality gate
    (`EvaluationParams`), registry and serving (`ServingParams`), and these: the data source,
    training, where it runs, limits and cost."""

    # --- data ----------------------------------------------------------------------------------
    train_data_uri: str = param(
        "",
        "Raw training records: a file, glob or gs:// URI of JSONL, JSON, CSV or Parquet, a Hugging "
        "Face dataset hf://datasets/ORG/NAME, optionally @REVISION and :SPLIT (staged under "
        "work_uri), or a "
        "BigQuery table bq://PROJECT.DATASET.TABLE (Dataflow). For scheduled runs it may contain "
        "the schedule-time placeholder so each run reads its own window.",
        required=True,
        steps=("preprocess",),
    )
    base_model: str = param(
        "",
        "Model to fine-tune: a local path, a gs:// URI of a Hugging Face model directory, a hub "
        f'id, or "{LATEST_REGISTERED}" to continue from the latest version of registered_model.',
        required=True,
        steps=("preprocess", "train", "evaluate", "register"),
    )
    backend: Backend = param(
        "local",
        'Where training runs: "local" (torchrun agents on this machine), "gke" (Kubeflow '
        'PyTorchJob) or "vertex" (Vertex AI CustomJob).',
        steps=("etcd_up", "train", "cleanup"),
    )
    seq_len: int = param(
        512,
        "Tokens per packed training row.",
        ge=SEQ_LEN_MIN,
        le=SEQ_LEN_MAX,
        steps=("preprocess", "register"),
    )
    eval_fraction: float = param(
        EVAL_FRACTION_DEFAULT,
        "Fraction of records held out for evaluation (deterministic by content hash).",
        gt=0.0,
        lt=EVAL_FRACTION_MAX,
        steps=("preprocess",),
    )
    preprocess_runner: Runner = param(
        "DirectRunner",
        'Beam runner for preprocessing: "DirectRunner" (in the task) or "DataflowRunner" (workers '
        "run the project image; temp and staging files under work_uri).",
        steps=("preprocess",),
    )
    dataflow_options: dict = param(  # type: ignore[type-arg]
        {},
        'Extra Dataflow options, e.g. {"max_num_workers": 20, "machine_type": "n2-standard-8", '
        '"subnetwork": "..."}.',
        steps=("preprocess",),
        cloud=True,
    )
    dataflow_service_account: str = param(
        "",
        "Service-account email the Dataflow workers run as; required with DataflowRunner (the "
        "Compute Engine default account has no roles under secure-by-default IAM).",
        steps=("preprocess",),
        cloud=True,
    )

    # --- data sources and record shapes (issue 33) -----------------------------------------------

    # --- recurring runs: replay, retention, unchanged windows (issue 48) -------------------------
    replay_fraction: float = param(
        0.0,
        "Share of the packed training tokens drawn from replay_source (data the model learnt "
        "before, against forgetting); 0: none. On a schedule the retention controller raises it "
        "after a run that forgot and lowers it back towards this value (docs/schedules.md).",
        ge=0.0,
        lt=1.0,
        steps=("evaluate",),
    )
    replay_source: str = param(
        "general",
        'Replay data, comma-separated: "general" (a small packaged general-instruction set), '
        '"previous" or "previous:N" (the windows of the schedule\'s last N successful runs), or '
        "any source train_data_uri takes.",
    )
    retention_target: float = param(
        0.0,
        "The retention the controller keeps a schedule at (general probes and eval_tasks, "
        "tuned over base); 0: min_general_retained; both 0: no control.",
        ge=0.0,
        le=1.0,
        steps=("evaluate",),
    )
    min_new_records: int = param(
        0,
        'Skip the run ("skipped: nothing new", no preprocessing, no GPU) when the window holds '
        "fewer new records than this since the schedule's last successful run; 0: never skip.",
        ge=0,
    )

    # --- training ------------------------------------------------------------------------------
    nodes: int = param(
        2,
        "Training nodes (torchrun agents / PyTorchJob replicas / CustomJob replicas).",
        ge=1,
        steps=("train",),
    )
    nproc_per_node: int = param(
        0,
        "Training processes per node; 0 starts one per accelerator (accelerator_count) on GPU "
        "machines, 1 on CPU.",
        ge=0,
        steps=("train",),
    )
    rdzv_backend: RdzvBackend = param(
        DEFAULT_RDZV_BACKEND,
        'Rendezvous backend: "etcd-v3" (per-run etcd, works on etcd 3.4+), "etcd-v2" or "c10d" '
        "(Vertex always rendezvouses with c10d at the primary replica).",
        steps=("etcd_up", "train"),
    )
    max_steps: int = param(200, "Optimizer steps to train for.", ge=1, steps=("train",))
    learning_rate: float = param(
        TrainConfig.lr,
        "Peak learning rate (AdamW, warmup then cosine decay).",
        gt=0.0,
        lt=1.0,
        steps=("train",),
    )
    trainer_overrides: dict = param(  # type: ignore[type-arg]
        {},
        'Any other trainer setting by name (docs/trainer.md), e.g. {"micro_batch_size": 8, '
        '"lora_rank": 16}.',
        steps=("train",),
    )

    # --- QLoRA and preference tuning (issue 34) -------------------------------------------------
    quantize_base: QuantizeBase = param(
        "none",
        'Base weights during training: "nf4" keeps the decoder blocks\' linear weights in 4-bit '
        "NormalFloat and trains LoRA adapters on them (QLoRA: a 7B model fits one 24 GB L4; needs "
        'lora_rank in trainer_overrides); "none" keeps them in full precision.',
        steps=("train",),
    )
    objective: Objective = param(
        "sft",
        '"sft": supervised fine-tuning on prompt/response data. "dpo": Direct Preference '
        "Optimization on {prompt, chosen, rejected} pairs (data_kind preference; reference = the "
        "base with the LoRA adapters disabled: needs lora_rank in trainer_overrides); evaluation "
        'then reports the win rate on held-out pairs. "grpo": reinforcement fine-tuning with '
        "verifiable rewards (GRPO) on prompt records (data_kind prompts) scored by rewards and/or "
        "reward_module (docs/grpo.md); evaluation then reports mean reward and pass rate.",
        steps=("train", "evaluate"),
    )
    rewards: str = param(
        "",
        "objective=grpo: built-in rewards as a JSON list, each {name, its arguments, optional "
        "weight}: exact_match (column, extract), regex (pattern, mode), json_schema (schema), "
        'length_penalty (max_chars), e.g. [{"name": "exact_match", "column": "answer", '
        '"extract": "last_number"}] (docs/grpo.md).',
        steps=("train", "evaluate"),
    )
    reward_module: str = param(
        "",
        "objective=grpo: a Python file (local or gs://) defining reward(completions, prompts, "
        "...) that takes the prompts' columns as keyword arguments and returns one float per "
        "completion, as TRL's reward functions; PATH:NAME names another function. Added to "
        "rewards with weight 1; run only inside the training and evaluation jobs.",
        steps=("train", "evaluate"),
    )

    # --- where it runs -------------------------------------------------------------------------
    project: str = param(
        "",
        "Google Cloud project id (cloud backends, Dataflow, Model Registry).",
        pattern=PROJECT_ID,
        steps=("preprocess", "train", "evaluate", "register", "deploy", "cleanup"),
        cloud=True,
    )
    region: str = param(
        DEFAULT_REGION,
        "Google Cloud region for Vertex AI, Dataflow and the Model Registry.",
        pattern=REGION,
        steps=("preprocess", "train", "evaluate", "register", "deploy", "cleanup"),
        cloud=True,
    )
    work_uri: str = param(
        "",
        "gs:// prefix for run files shared between steps (Dataflow temp, checkpoints); cloud "
        "runs only.",
        steps=("preprocess", "train"),
        cloud=True,
    )
    namespace: str = param(
        DEFAULT_NAMESPACE,
        "Kubernetes namespace for the per-run etcd and the PyTorchJob (gke backend).",
        pattern=K8S_LABEL_NAME,
        steps=("etcd_up", "train", "cleanup"),
        cloud=True,
    )
    gke_cluster: str = param(
        "",
        'GKE cluster "projects/P/locations/L/clusters/C" when Vertex AI Pipelines drives GKE; '
        "empty means the cluster the pipeline runs in.",
        pattern=(
            r"projects/[^/]+/locations/[^/]+/clusters/[^/]+",
            "projects/P/locations/L/clusters/C",
        ),
        steps=("etcd_up", "train", "cleanup"),
        cloud=True,
    )
    gke_job_api: JobApi = param(
        DEFAULT_JOB_API,
        'Kubeflow API of the GKE training job: "trainjob" (Kubeflow Trainer v2), "pytorchjob" '
        '(Training Operator v1) or "auto" (what the cluster serves, TrainJob first; the first '
        "step names what to install when it serves neither).",
        steps=("train",),
        cloud=True,
    )
    kueue_queue: str = param(
        "",
        "GKE: the Kueue LocalQueue that admits the training job whole or not at all (infra/ "
        'creates "llmft"); empty: no Kueue.',
        pattern=K8S_LABEL_NAME,
        steps=("train",),
        cloud=True,
    )
    gpudirect: bool = param(
        False,
        "GKE: the GPU node pool has the GPUDirect NIC networks and NCCL plugin (the stack's "
        "gke.gpudirect: TCPX on A3 High, TCPXO on A3 Mega, RDMA on A3 Ultra and A4; `llmft config "
        "from-stack` sets it): a multi-node training job then uses the GPU NICs (a TrainJob "
        "through the runtime variant that carries the setup). False: NCCL uses the primary NIC.",
        steps=("train",),
        cloud=True,
    )
    machine_type: str = param(
        DEFAULT_MACHINE_TYPE,
        "Machine type per node: on Vertex AI each replica's (e.g. a3-highgpu-8g, which carries "
        "8 x NVIDIA_H100_80GB); on GKE the GPU node pool's, to check the accelerators fit.",
        steps=("train",),
        cloud=True,
    )
    accelerator_type: str = param(
        DEFAULT_ACCELERATOR_TYPE,
        "Accelerator per node: a Vertex name such as NVIDIA_H100_80GB; on GKE the matching "
        "gke-accelerator node selector is used. Empty for CPU-only training.",
        steps=("train",),
        cloud=True,
    )
    accelerator_count: int = param(
        DEFAULT_ACCELERATOR_COUNT,
        "Accelerators per node (0 for CPU-only training).",
        ge=0,
        steps=("train",),
        cloud=True,
    )
    service_account: str = param(
        "",
        "Identity of the training job. Vertex: a service-account email (empty: the Vertex AI "
        "Custom Code Service Agent). GKE: the Kubernetes service account of the PyTorchJob pods, "
        "bound to a Google service account by Workload Identity (required).",
        steps=("train",),
        cloud=True,
    )
    hf_token_secret: str = param(
        "llmft-hf-token",
        'Name of the Kubernetes Secret (key "token", GKE) or Secret Manager secret (Vertex, read '
        "at run time) holding a Hugging Face token; optional (public models need none); never "
        "the token itself.",
        steps=("preprocess", "train", "evaluate"),
        cloud=True,
    )

    # --- serving, deployment and tracking (issue 30) -------------------------------------------
    tensorboard: str = param(
        "",
        "Vertex AI TensorBoard instance (projects/P/locations/L/tensorboards/ID) the training "
        "CustomJob streams its events to; empty: events stay under work_uri.",
        pattern=(
            r"projects/[^/]+/locations/[^/]+/tensorboards/[^/]+",
            "projects/P/locations/L/tensorboards/ID",
        ),
        steps=("train",),
        cloud=True,
    )
    experiment: str = param(
        "",
        "Vertex AI Experiment that gets a run with this run's parameters and final metrics; "
        "empty: none.",
        pattern=(r"[a-z0-9][a-z0-9-]{0,127}", "lowercase letters, digits and '-'"),
        steps=("train", "evaluate"),
        cloud=True,
    )
    encryption_key: str = param(
        "",
        "Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) for the training "
        "CustomJob and a created endpoint; `llmft run` fills in the pipeline's vertex.encryption_key.",
        pattern=(
            r"projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+",
            "projects/P/locations/L/keyRings/R/cryptoKeys/K",
        ),
        steps=("train", "deploy"),
        cloud=True,
    )

    tracking_uri: str = param(
        "",
        "MLflow tracking: an MLflow server (http(s)://HOST[:PORT]; its token by "
        "tracking_token_secret) or, for local runs, a local store (sqlite:////abs/path/mlflow.db, "
        "file:///abs/path). One MLflow run per pipeline run, nested train and evaluate runs, the "
        "trainer's metrics every log_every steps, a model version when the gate passes "
        "(docs/tracking.md). Empty: no MLflow.",
        steps=("train", "evaluate"),
    )
    tracking_token_secret: str = param(
        "",
        "Name of the secret holding the MLflow server's token, read at run time into "
        "MLFLOW_TRACKING_TOKEN: a Secret Manager secret in project, or on KFP on GKE the "
        'Kubernetes Secret llmft-mlflow-token (key "token") the pipeline mounts; empty: none. '
        "Never the token itself.",
        steps=("train", "evaluate"),
        cloud=True,
    )

    # --- cloud launch limits (issue 29) --------------------------------------------------------
    train_timeout_s: int = param(
        TRAIN_TIMEOUT_MAX_S,
        "Longest the training job may run, provisioning included (a Vertex flex-start job's "
        "unbilled queue wait excepted) (seconds): the train step "
        "cancels it then, and the job itself carries the limit plus a short grace "
        "(PyTorchJob activeDeadlineSeconds, CustomJob timeout) so it ends even if the step was "
        "killed first.",
        ge=60,
        le=TRAIN_TIMEOUT_MAX_S,
        steps=("train",),
    )

    # --- cost and capacity (components/preflight/cost.py, components/platform/capacity.py) ------------------------
    capacity: Capacity = param(
        "on-demand",
        'How the training machines are obtained: "on-demand", "spot" (cheaper, preemptible: '
        'checkpoints every few minutes and restarts that resume) or "flex-start" (Dynamic '
        "Workload Scheduler: waits for capacity, then runs unpreempted at a discount).",
        steps=("train",),
        cloud=True,
    )
    max_cost_usd: float = param(
        0.0,
        "Budget in US dollars: a run whose estimate exceeds it is refused before anything "
        "starts, and the training job's timeout is set so that its spend stays within it "
        "(0: no budget).",
        ge=0.0,
    )
    max_wait_minutes: int = param(
        0,
        "capacity=flex-start on Vertex AI: how long the job may wait for its machines before it "
        "fails (0: Vertex's default).",
        ge=0,
        steps=("train",),
        cloud=True,
    )
    reservation: str = param(
        "",
        "Vertex AI: a Compute Engine reservation to run in "
        '("projects/P/zones/Z/reservations/NAME"); empty uses none.',
        pattern=(
            r"projects/[^/]+/zones/[^/]+/reservations/[^/]+",
            "projects/P/zones/Z/reservations/NAME",
        ),
        steps=("train",),
        cloud=True,
    )
    gpu_hour_price_usd: float = param(
        0.0,
        "Price of one GPU-hour (machine share included) for the estimate and the actual cost; "
        "0 takes the dated price table in components/preflight/cost.py for accelerator_type and capacity.",
        ge=0.0,
        steps=("train",),
    )
    model_parameters: int = param(
        0,
        "Parameters of base_model for the cost estimate; 0 reads them from the model's "
        "config.json (local or gs://).",
        ge=0,
    )

    @classmethod
    def for_target(cls, target: str = "local") -> RunParams:
        """The defaults of a pipeline target (`TARGET_DEFAULTS`)."""
        return dataclasses.replace(cls(), **copy.deepcopy(TARGET_DEFAULTS[target]))

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def fields() -> dict[str, dataclasses.Field[Any]]:
    """The run parameters by name, in pipeline order."""
    return {f.name: f for f in dataclasses.fields(RunParams)}


def defaults(target: str = "local") -> dict[str, Any]:
    """Every parameter's default for a pipeline target ("local", "vertex", "kfp")."""
    return RunParams.for_target(target).as_dict()


def describe(name: str) -> str:
    """A parameter's description."""
    return str(fields()[name].metadata["help"])


def type_hints() -> dict[str, Any]:
    """Each parameter's type annotation by name (`Literal[...]` for the ones with choices)."""
    return typing.get_type_hints(RunParams)


def choices(name: str) -> tuple[str, ...]:
    """The allowed values of a `Literal` parameter (empty for free-form ones)."""
    return literal_choices(type_hints()[name])
