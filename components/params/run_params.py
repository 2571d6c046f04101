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

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Literal

from components.launchers.vocab import (
    DEFAULT_ACCELERATOR_COUNT,
    DEFAULT_ACCELERATOR_TYPE,
    DEFAULT_MACHINE_TYPE,
    DEFAULT_NAMESPACE,
    DEFAULT_RDZV_BACKEND,
    DEFAULT_REGION,
    K8S_LABEL_NAME,
    PROJECT_ID,
    REGION,
    RdzvBackend,
)
from components.params import param_checks as checks
from components.params.param_schema import field_error, literal_choices, param
from components.params.trainer_params import trainer_override_errors
from components.platform.capacity import Capacity
from components.runtime.run_identity import check_placeholder_resolved
from components.serving.presets import LoraServing, ServingPreset, check_lora_serving
from trainer.config import TrainConfig
from trainer.packed_data.format import (
    EVAL_FRACTION_DEFAULT,
    EVAL_FRACTION_MAX,
    SEQ_LEN_MAX,
    SEQ_LEN_MIN,
)

Backend = Literal["local", "gke", "vertex"]
Runner = Literal["DirectRunner", "DataflowRunner"]
DataKind = Literal["instruction", "text", "preference"]
"""beam_preprocess.options.DATA_KINDS (a test keeps them equal)."""
RecordFormat = Literal["auto", "prompt_response", "alpaca", "chat", "sharegpt"]
"""beam_preprocess.shapes.RECORD_FORMATS (a test keeps them equal)."""
ToolTurns = Literal["reject", "filter"]
"""beam_preprocess.shapes.TOOL_TURNS (a test keeps them equal)."""
QuantizeBase = Literal["none", "nf4"]
Objective = Literal["sft", "dpo"]
JudgeMetric = Literal[
    "", "text_quality", "instruction_following", "fluency", "coherence", "safety", "verbosity",
    "groundedness",
]  # fmt: skip
"""components/evaluation/judge.py's PAIRWISE_METRICS, or "" for no judge (tests check they agree)."""

LATEST_REGISTERED = "latest-registered"
"""`base_model` / `champion_model` value: the newest version of `registered_model` in the Vertex AI
Model Registry (resolved by the pipeline's first step)."""
SCHEDULE_TIME_PLACEHOLDER = "{{$.pipeline_job_schedule_time_utc}}"
"""KFP's schedule-time placeholder (`dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER`), written
literally in `train_data_uri` by scheduled runs; the first step fills it in."""

TRAIN_TIMEOUT_MAX_S = 7 * 24 * 3600 - 3600
"""The longest `train_timeout_s`: an hour under 7 days (Vertex's own CustomJob default timeout),
so that the jobs' deadline (this plus a short grace) stays within it; the KFP target bounds the
train task a little above the jobs' deadline (pipelines/fine_tune.py)."""


@dataclass(frozen=True)
class RunParams:
    """Every parameter of one fine-tune run (the `fine_tune` pipeline's inputs)."""

    # --- data ----------------------------------------------------------------------------------
    train_data_uri: str = param(
        "",
        "Raw training records: a file, glob or gs:// URI of JSONL, JSON, CSV or Parquet, a Hugging "
        "Face dataset hf://datasets/ORG/NAME, optionally @REVISION and :SPLIT (staged under "
        "work_uri), or a "
        "BigQuery table bq://PROJECT.DATASET.TABLE (Dataflow). For scheduled runs it may contain "
        "the schedule-time placeholder so each run reads its own window.",
        required=True,
    )
    base_model: str = param(
        "",
        "Model to fine-tune: a local path, a gs:// URI of a Hugging Face model directory, a hub "
        f'id, or "{LATEST_REGISTERED}" to continue from the latest version of registered_model.',
        required=True,
    )
    backend: Backend = param(
        "local",
        'Where training runs: "local" (torchrun agents on this machine), "gke" (Kubeflow '
        'PyTorchJob) or "vertex" (Vertex AI CustomJob).',
    )
    data_kind: DataKind = param(
        "instruction",
        '"instruction" for prompt/response or chat messages records, "text" for plain '
        'causal-LM text, "preference" for {prompt, chosen, rejected} pairs (objective dpo).',
    )
    seq_len: int = param(512, "Tokens per packed training row.", ge=SEQ_LEN_MIN, le=SEQ_LEN_MAX)
    eval_fraction: float = param(
        EVAL_FRACTION_DEFAULT,
        "Fraction of records held out for evaluation (deterministic by content hash).",
        gt=0.0,
        lt=EVAL_FRACTION_MAX,
    )
    preprocess_runner: Runner = param(
        "DirectRunner",
        'Beam runner for preprocessing: "DirectRunner" (in the task) or "DataflowRunner" (workers '
        "run the project image; temp and staging files under work_uri).",
    )
    dataflow_options: dict = param(  # type: ignore[type-arg]
        {},
        'Extra Dataflow options, e.g. {"max_num_workers": 20, "machine_type": "n2-standard-8", '
        '"subnetwork": "..."}.',
    )
    dataflow_service_account: str = param(
        "",
        "Service-account email the Dataflow workers run as; required with DataflowRunner (the "
        "Compute Engine default account has no roles under secure-by-default IAM).",
    )

    # --- data sources and record shapes (issue 33) -----------------------------------------------
    record_format: RecordFormat = param(
        "auto",
        'Shape of instruction records: "auto" (detected per record: messages, conversations, '
        "instruction+output, else prompt/response), "
        '"prompt_response", "alpaca" (instruction, optional input, output), "chat" (OpenAI '
        '[{role, content}]) or "sharegpt" (conversations of {from, value}); docs/preprocess.md.',
    )
    prompt_field: str = param(
        "",
        'Field holding the prompt; empty: the format\'s default ("prompt", alpaca "instruction").',
    )
    response_field: str = param(
        "",
        'Field holding the response; empty: the format\'s default ("response", alpaca "output").',
    )
    messages_field: str = param(
        "",
        'Field holding a conversation; empty: the format\'s default ("messages", sharegpt '
        '"conversations").',
    )
    text_field: str = param("", 'Field holding plain text (data_kind "text"); empty: "text".')
    system_field: str = param(
        "", 'Field holding an optional system prompt, prepended as a system turn; empty: "system".'
    )
    tool_turns: ToolTurns = param(
        "reject",
        'Conversations with tool calls or tool results: "reject" (counted in rejected/) or '
        '"filter" (counted in filtered/); they are never trained on.',
    )
    chat_template: str = param(
        "",
        'Chat template replacing the tokenizer\'s own (needed for base models without one): "chatml", '
        '"alpaca", or a Jinja template string; empty uses the tokenizer\'s.',
    )
    bigquery_query: str = param(
        "",
        "For train_data_uri bq://PROJECT.DATASET.TABLE: a SQL query naming the table as {table} "
        "(read at the run's snapshot time, recorded in the manifest); empty reads every row.",
    )

    # --- training ------------------------------------------------------------------------------
    nodes: int = param(
        2, "Training nodes (torchrun agents / PyTorchJob replicas / CustomJob replicas).", ge=1
    )
    nproc_per_node: int = param(
        0,
        "Training processes per node; 0 starts one per accelerator (accelerator_count) on GPU "
        "machines, 1 on CPU.",
        ge=0,
    )
    rdzv_backend: RdzvBackend = param(
        DEFAULT_RDZV_BACKEND,
        'Rendezvous backend: "etcd-v3" (per-run etcd, works on etcd 3.4+), "etcd-v2" or "c10d" '
        "(Vertex always rendezvouses with c10d at the primary replica).",
    )
    max_steps: int = param(200, "Optimizer steps to train for.", ge=1)
    learning_rate: float = param(
        TrainConfig.lr, "Peak learning rate (AdamW, warmup then cosine decay).", gt=0.0, lt=1.0
    )
    trainer_overrides: dict = param(  # type: ignore[type-arg]
        {},
        'Any other trainer setting by name (docs/trainer.md), e.g. {"micro_batch_size": 8, '
        '"lora_rank": 16}.',
    )

    # --- QLoRA and preference tuning (issue 34) -------------------------------------------------
    quantize_base: QuantizeBase = param(
        "none",
        'Base weights during training: "nf4" keeps the decoder blocks\' linear weights in 4-bit '
        "NormalFloat and trains LoRA adapters on them (QLoRA: a 7B model fits one 24 GB L4; needs "
        'lora_rank in trainer_overrides); "none" keeps them in full precision.',
    )
    objective: Objective = param(
        "sft",
        '"sft": supervised fine-tuning on prompt/response data. "dpo": Direct Preference '
        "Optimization on {prompt, chosen, rejected} pairs (data_kind preference; reference = the "
        "base with the LoRA adapters disabled: needs lora_rank in trainer_overrides); evaluation "
        "then reports the win rate on held-out pairs.",
    )

    # --- where it runs -------------------------------------------------------------------------
    project: str = param(
        "",
        "Google Cloud project id (cloud backends, Dataflow, Model Registry).",
        pattern=PROJECT_ID,
    )
    region: str = param(
        DEFAULT_REGION,
        "Google Cloud region for Vertex AI, Dataflow and the Model Registry.",
        pattern=REGION,
    )
    work_uri: str = param(
        "",
        "gs:// prefix for run files shared between steps (Dataflow temp, checkpoints); cloud "
        "runs only.",
    )
    namespace: str = param(
        DEFAULT_NAMESPACE,
        "Kubernetes namespace for the per-run etcd and the PyTorchJob (gke backend).",
        pattern=K8S_LABEL_NAME,
    )
    gke_cluster: str = param(
        "",
        'GKE cluster "projects/P/locations/L/clusters/C" when Vertex AI Pipelines drives GKE; '
        "empty means the cluster the pipeline runs in.",
        pattern=(
            r"projects/[^/]+/locations/[^/]+/clusters/[^/]+",
            "projects/P/locations/L/clusters/C",
        ),
    )
    machine_type: str = param(
        DEFAULT_MACHINE_TYPE,
        "Machine type per node: on Vertex AI each replica's (e.g. a3-highgpu-8g, which carries "
        "8 x NVIDIA_H100_80GB); on GKE the GPU node pool's, to check the accelerators fit.",
    )
    accelerator_type: str = param(
        DEFAULT_ACCELERATOR_TYPE,
        "Accelerator per node: a Vertex name such as NVIDIA_H100_80GB; on GKE the matching "
        "gke-accelerator node selector is used. Empty for CPU-only training.",
    )
    accelerator_count: int = param(
        DEFAULT_ACCELERATOR_COUNT, "Accelerators per node (0 for CPU-only training).", ge=0
    )
    service_account: str = param(
        "",
        "Identity of the training job. Vertex: a service-account email (empty: the Vertex AI "
        "Custom Code Service Agent). GKE: the Kubernetes service account of the PyTorchJob pods, "
        "bound to a Google service account by Workload Identity (required).",
    )
    hf_token_secret: str = param(
        "llmft-hf-token",
        'Name of the Kubernetes Secret (key "token", GKE) or Secret Manager secret (Vertex, read '
        "at run time) holding a Hugging Face token; optional (public models need none); never "
        "the token itself.",
    )

    # --- evaluation and registry ---------------------------------------------------------------
    eval_accelerator_type: str = param(
        "NVIDIA_L4",
        "Accelerator of the evaluation step on Vertex AI (e.g. NVIDIA_L4, NVIDIA_A100_80GB for "
        "30B+ models); on KFP any GPU node serves it. Evaluation runs in bf16 on a GPU.",
    )
    eval_accelerator_count: int = param(
        1, "GPUs for the evaluation step (at least 1 in the cloud).", ge=0
    )
    max_eval_examples: int = param(
        200, "Held-out prompts to generate answers for (bounds evaluation time).", ge=1
    )
    min_loss_improvement: float = param(
        0.0,
        "Quality gate: the tuned eval loss must be below the base's by at least this much.",
    )
    min_exact_match: float = param(
        0.0,
        "Quality gate: the tuned model's exact-match rate on held-out prompts must be at least "
        "this.",
        ge=0.0,
        le=1.0,
    )
    min_general_retained: float = param(
        0.0,
        "Quality gate against forgetting: of the packaged general-knowledge probes the base model "
        "answers correctly, the tuned model must still answer at least this fraction (0 disables "
        "the check; use it for pretrained bases and recurring fine-tunes).",
        ge=0.0,
        le=1.0,
    )
    register_model: bool = param(
        False, "Upload the tuned model to Vertex AI Model Registry when it passes the gate."
    )
    registered_model: str = param(
        "",
        "Vertex AI model (resource name or display name) to add versions to or take "
        f'"{LATEST_REGISTERED}" from.',
    )
    champion_model: str = param(
        "",
        "Optional model the tuned one must also beat: a model URI, or "
        f'"{LATEST_REGISTERED}" for the newest version of registered_model (recurring '
        "fine-tunes); empty skips the comparison.",
    )
    serving_image: str = param(
        "",
        "Serving container image (pinned tag) for the registered model, started as "
        "serving_preset says (e.g. Model Garden's pytorch-vllm-serve image for vertex-vllm); "
        "required when register_model is true.",
    )

    # --- serving, deployment and tracking (issue 30) -------------------------------------------
    serving_preset: ServingPreset = param(
        "vertex-vllm",
        'How serving_image starts the model (components/serving/presets.py): "vertex-vllm" (Vertex AI '
        'Model Garden pytorch-vllm-serve image), "vllm-openai" (vLLM\'s own OpenAI server image), '
        'or "custom" (the image alone, e.g. a TGI image that reads AIP_STORAGE_URI itself).',
    )
    lora_serving: LoraServing = param(
        "merged",
        'For a LoRA run: serve the "merged" model, or the base model plus the "adapter" with '
        "vLLM --enable-lora (refused until verified on a real project: docs/deploy/README.md).",
    )
    deploy_endpoint: str = param(
        "",
        "Deploy the registered version to this Vertex AI endpoint (resource name or display name; "
        "created when missing) and send it a smoke prompt; empty: no deployment. A local run "
        "serves the model on this machine instead (any non-empty value).",
    )
    deploy_machine_type: str = param(
        "g2-standard-12", "Machine type serving the deployed model (e.g. g2-standard-12 + 1 L4)."
    )
    deploy_accelerator_type: str = param(
        "NVIDIA_L4", "Accelerator of the serving machine (Vertex name); empty for CPU."
    )
    deploy_accelerator_count: int = param(
        1, "Accelerators per serving replica (vLLM shards the model over them).", ge=0
    )
    deploy_spot: bool = param(False, "Serve on Spot VMs (cheaper; replicas may be preempted).")
    deploy_traffic_percent: int = param(
        100,
        "Traffic share of the new version when the endpoint already serves earlier versions "
        "(champion/challenger); 100 replaces them once the smoke prompt passed.",
        ge=1,
        le=100,
    )
    tensorboard: str = param(
        "",
        "Vertex AI TensorBoard instance (projects/P/locations/L/tensorboards/ID) the training "
        "CustomJob streams its events to; empty: events stay under work_uri.",
        pattern=(
            r"projects/[^/]+/locations/[^/]+/tensorboards/[^/]+",
            "projects/P/locations/L/tensorboards/ID",
        ),
    )
    experiment: str = param(
        "",
        "Vertex AI Experiment that gets a run with this run's parameters and final metrics; "
        "empty: none.",
        pattern=(r"[a-z0-9][a-z0-9-]{0,127}", "lowercase letters, digits and '-'"),
    )
    encryption_key: str = param(
        "",
        "Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) for the training "
        "CustomJob and a created endpoint; `llmft run` fills in the pipeline's vertex.encryption_key.",
        pattern=(
            r"projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+",
            "projects/P/locations/L/keyRings/R/cryptoKeys/K",
        ),
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
    )

    # --- cost and capacity (components/preflight/cost.py, components/platform/capacity.py) ------------------------
    capacity: Capacity = param(
        "on-demand",
        'How the training machines are obtained: "on-demand", "spot" (cheaper, preemptible: '
        'checkpoints every few minutes and restarts that resume) or "flex-start" (Dynamic '
        "Workload Scheduler: waits for capacity, then runs unpreempted at a discount).",
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
    )
    reservation: str = param(
        "",
        "Vertex AI: a Compute Engine reservation to run in "
        '("projects/P/zones/Z/reservations/NAME"); empty uses none.',
        pattern=(
            r"projects/[^/]+/zones/[^/]+/reservations/[^/]+",
            "projects/P/zones/Z/reservations/NAME",
        ),
    )
    gpu_hour_price_usd: float = param(
        0.0,
        "Price of one GPU-hour (machine share included) for the estimate and the actual cost; "
        "0 takes the dated price table in components/preflight/cost.py for accelerator_type and capacity.",
        ge=0.0,
    )
    model_parameters: int = param(
        0,
        "Parameters of base_model for the cost estimate; 0 reads them from the model's "
        "config.json (local or gs://).",
        ge=0,
    )

    # --- evaluation: standard tasks and judge (issue 31) ---------------------------------------
    eval_tasks: str = param(
        "",
        "lm-evaluation-harness tasks run on the base and the tuned model, comma-separated (e.g. "
        "mmlu,arc_easy,hellaswag,gsm8k; the project ships llmft_facts_mc and llmft_facts_gen "
        "over local data); empty runs none. The harness's tasks download their data from the "
        "Hugging Face Hub.",
    )
    eval_num_fewshot: int = param(
        -1, "Few-shot examples per harness prompt; -1 uses each task's own default.", ge=-1
    )
    eval_limit: int = param(
        0, "Documents per harness task (the first N, bounds evaluation time); 0 runs all.", ge=0
    )
    max_task_regression: float = param(
        100.0,
        "Quality gate on the harness tasks: on each task's headline metric (e.g. mmlu acc) the "
        "tuned model may score at most this many points (0-100) below the base; 100 reports the "
        "tasks without gating.",
        ge=0.0,
        le=100.0,
    )
    judge_metric: JudgeMetric = param(
        "",
        "Pairwise judge of base vs tuned answers to the held-out prompts by the Vertex AI Gen AI "
        'evaluation service, with this pairwise metric (e.g. "text_quality"); empty: no judge.',
    )
    judge_min_win_rate: float = param(
        0.0,
        "Quality gate on the judge: the tuned model's win rate against the base (ties count "
        "half) must be at least this (0 disables the check).",
        ge=0.0,
        le=1.0,
    )

    @classmethod
    def for_target(cls, target: str = "local") -> RunParams:
        """The defaults of a pipeline target (`TARGET_DEFAULTS`)."""
        return dataclasses.replace(cls(), **TARGET_DEFAULTS[target])

    def errors(self, *, target: str = "", run_id: str = "") -> list[str]:
        """Every problem with these parameters, each saying what to change; [] when valid.

        `target` is where the pipeline runs (local, vertex, kfp; "" skips the target's rules): the
        compiled pipeline passes its own. `run_id` is the run's resolved id, when known.
        """
        errors = [
            e
            for f in dataclasses.fields(self)
            if (e := field_error(f, getattr(self, f.name), choices(f.name)))
        ]
        errors += [e for k, v in self.as_dict().items() if (e := checks.check_not_a_token(k, v))]
        errors += trainer_override_errors(
            self.trainer_overrides,
            max_steps=self.max_steps,
            learning_rate=self.learning_rate,
            quantize_base=self.quantize_base,
            objective=self.objective,
        )
        errors += [
            e
            for e in (
                checks.check_backend_for_target(self.backend, target),
                checks.check_nproc_per_node(
                    self.backend, self.nproc_per_node, self.accelerator_count
                ),
                checks.check_service_account(
                    self.backend,
                    self.service_account,
                    TARGET_DEFAULTS["kfp"]["service_account"],
                ),
                checks.check_objective_data(self.objective, self.data_kind),
                checks.check_dataflow_service_account(
                    self.preprocess_runner, self.dataflow_service_account
                ),
                checks.check_secret_name("hf_token_secret", self.hf_token_secret),
                checks.check_chat_template(self.chat_template),
                check_placeholder_resolved("run id", run_id),
                checks.check_eval_accelerator(
                    target, self.eval_accelerator_type, self.eval_accelerator_count
                ),
            )
            if e
        ]
        fields = {
            "prompt_field": self.prompt_field,
            "response_field": self.response_field,
            "messages_field": self.messages_field,
            "text_field": self.text_field,
            "system_field": self.system_field,
        }
        errors += checks.check_record_format(self.data_kind, self.record_format, fields)
        errors += checks.check_machine_accelerator(
            self.backend, self.machine_type, self.accelerator_type, self.accelerator_count
        )
        errors += checks.check_data_source(
            self.train_data_uri, self.bigquery_query, self.preprocess_runner
        )
        errors += checks.check_eval_quality(
            eval_tasks=self.eval_tasks,
            max_task_regression=self.max_task_regression,
            judge_metric=self.judge_metric,
            judge_min_win_rate=self.judge_min_win_rate,
            project=self.project,
        )
        errors += checks.check_cloud_locations(
            cloud=self.backend in ("gke", "vertex") or self.preprocess_runner == "DataflowRunner",
            project=self.project,
            region=self.region,
            work_uri=self.work_uri,
            train_data_uri=self.train_data_uri,
        )
        if gke_error := checks.check_gke_accelerator(self.backend, self.accelerator_type):
            errors.append(gke_error)
        if capacity_error := checks.check_capacity(
            self.backend, self.capacity, self.reservation, self.max_wait_minutes
        ):
            errors.append(capacity_error)
        # --- issue 30/32 review: flex-start GPUs, adapter serving ---
        if flex_error := checks.check_flex_start_accelerator(
            self.backend, self.capacity, self.accelerator_type
        ):
            errors.append(flex_error)
        if lora_error := check_lora_serving(self.lora_serving):
            errors.append(lora_error)
        errors += checks.check_registry(
            latest=LATEST_REGISTERED,
            models=(self.base_model, self.champion_model),
            register_model=self.register_model,
            registered_model=self.registered_model,
            serving_image=self.serving_image,
            serving_preset=self.serving_preset,
        )
        errors += checks.check_deploy(
            backend=self.backend,
            deploy_endpoint=self.deploy_endpoint,
            register_model=self.register_model,
            machine_type=self.deploy_machine_type,
            accelerator_type=self.deploy_accelerator_type,
            accelerator_count=self.deploy_accelerator_count,
            serving_preset=self.serving_preset,
            lora_serving=self.lora_serving,
        )
        return errors

    def check(self) -> RunParams:
        """Raise one ValueError listing every problem; return self when valid."""
        raise_errors(self.errors())
        return self

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


TARGET_DEFAULTS: dict[str, dict[str, Any]] = {
    "local": {},
    "vertex": {"backend": "vertex", "preprocess_runner": "DataflowRunner"},
    "kfp": {
        "backend": "gke",
        "preprocess_runner": "DataflowRunner",
        "service_account": "llmft-trainer",  # training pods' KSA (docs/deploy/rbac.yaml)
    },
}
"""Per-target defaults of the parameters whose right value depends on where the pipeline runs
(the fields' own defaults are the local runner's): a run launched from the console with only
data, base model, project, bucket and Dataflow account filled in must pass (tests/test_compile.py)."""


def raise_errors(errors: list[str]) -> None:
    """One ValueError listing every problem (the CLI prints it after `error:`)."""
    if errors:
        raise ValueError(
            f"{len(errors)} invalid run parameter(s):\n"
            + "\n".join(f"  - {checks.redact_tokens(e)}" for e in errors)
        )


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
