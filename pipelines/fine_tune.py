"""The fine-tune pipeline: one source, two compile targets.

    validate_inputs -> preprocess -> etcd_up -> train -> evaluate -> If(passed and register): register
    all inside dsl.ExitHandler(cleanup)

`build_fine_tune(target)` returns the pipeline for a target:
- "vertex": a single YAML document (Vertex AI Pipelines cannot parse kfp-kubernetes' second
  document); the launchers themselves reach GKE or Vertex CustomJob. Defaults: backend=vertex,
  Dataflow preprocessing.
- "kfp": KFP on GKE, with kfp-kubernetes settings for the task pods (the HF token Secret as env,
  pod labels, timeouts). Defaults: backend=gke, Dataflow preprocessing, the `llmft-pipeline`
  Kubernetes service account (docs/deploy/rbac.yaml).
- "local": what `llmft run --backend local` runs through kfp.local (never compiled).
Each target's defaults are what a run launched from the console with only data, base model,
project and bucket filled in needs (tests/test_compile.py checks it); `validate_inputs` receives
the target and refuses a backend that cannot run there.

Every task sets CPU/memory (Vertex runs a task without them on a 4 vCPU / 16 GB machine);
evaluation gets an accelerator (`eval_accelerator_type`, `eval_accelerator_count`) so a
multi-billion-parameter model is scored in bf16 on a GPU.

Resource names and labels come from the run id (`dsl.PIPELINE_JOB_ID_PLACEHOLDER`): the exit
handler cannot consume the guarded tasks' outputs, so cleanup finds what the run made by label.
Steps with side effects never use the cache.
"""

from collections.abc import Callable
from typing import Any

from kfp import dsl

from components import kfp_components as c

PIPELINE_NAME = "llmft-fine-tune"
TARGETS = ("vertex", "kfp")
"""The compile targets (compiled/fine_tune.<target>.yaml)."""
BUILD_TARGETS = (*TARGETS, "local")
TARGET_DEFAULTS: dict[str, dict[str, str]] = {
    "vertex": {"backend": "vertex", "preprocess_runner": "DataflowRunner", "service_account": ""},
    "kfp": {
        "backend": "gke",
        "preprocess_runner": "DataflowRunner",
        "service_account": "llmft-pipeline",
    },
    "local": {"backend": "local", "preprocess_runner": "DirectRunner", "service_account": ""},
}
"""Per-target defaults of the parameters whose right value depends on where the pipeline runs."""
GKE_EVAL_GPU = "nvidia.com/gpu"
"""KFP on Kubernetes takes the accelerator as a resource name; Vertex as a type (NVIDIA_L4)."""
STEP_RESOURCES: dict[str, tuple[str, str]] = {
    "validate-inputs": ("1", "4G"),
    "preprocess": ("8", "32G"),  # DirectRunner works in the task; Dataflow only launches from it
    "etcd-up": ("1", "2G"),
    "train": ("1", "4G"),  # only follows the training job, which has its own machines
    "evaluate": ("12", "48G"),  # with one L4: a g2-standard-12; fits 7B in bf16
    "register": ("1", "4G"),
    "cleanup": ("1", "2G"),
}
"""CPU and memory limits per task (Vertex sizes the machine from limits, not requests)."""
HF_TOKEN_SECRET = "llmft-hf-token"
"""Kubernetes Secret (key `token`) mounted as HF_TOKEN on KFP-on-GKE task pods, when it exists."""


def build_fine_tune(target: str = "vertex", schedule_time: bool = True) -> Callable[..., Any]:
    """The `fine_tune` pipeline function for a compile target ("vertex" or "kfp").

    Args:
        target: "vertex", "kfp" or "local".
        schedule_time: pass the run's schedule time to validate_inputs (for `train_data_uri`
            windows). kfp.local cannot resolve that placeholder (it crashes on it), so the local
            target never passes it: there is no schedule locally anyway.
    """
    if target not in BUILD_TARGETS:
        raise ValueError(f"target={target!r}: choose one of {', '.join(BUILD_TARGETS)}")
    defaults = TARGET_DEFAULTS[target]
    schedule_time = schedule_time and target != "local"

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description=(
            "Fine-tune a causal LM: Beam preprocessing to packed shards, a per-run etcd, multi-node "
            "FSDP2 training (local torchrun agents, PyTorchJob on GKE or Vertex CustomJob), "
            "before/after evaluation with a quality gate, optional Model Registry upload, and "
            "cleanup of everything the run created."
        ),
    )
    def fine_tune(
        train_data_uri: str = "",
        base_model: str = "",
        backend: str = defaults["backend"],
        data_kind: str = "instruction",
        seq_len: int = 512,
        eval_fraction: float = 0.05,
        preprocess_runner: str = defaults["preprocess_runner"],
        dataflow_options: dict = {},  # noqa: B006 - KFP pipeline default, never mutated
        dataflow_service_account: str = "",
        nodes: int = 2,
        nproc_per_node: int = 0,
        rdzv_backend: str = "etcd-v3",
        max_steps: int = 200,
        learning_rate: float = 1e-3,
        trainer_overrides: dict = {},  # noqa: B006 - KFP pipeline default, never mutated
        project: str = "",
        region: str = "us-central1",
        work_uri: str = "",
        namespace: str = "kubeflow",
        gke_cluster: str = "",
        machine_type: str = "a3-highgpu-8g",
        accelerator_type: str = "NVIDIA_H100_80GB",
        accelerator_count: int = 8,
        service_account: str = defaults["service_account"],
        hf_token_secret: str = HF_TOKEN_SECRET,
        eval_accelerator_type: str = "NVIDIA_L4",
        eval_accelerator_count: int = 1,
        max_eval_examples: int = 200,
        min_loss_improvement: float = 0.0,
        min_exact_match: float = 0.0,
        register_model: bool = False,
        registered_model: str = "",
        champion_model: str = "",
        serving_image: str = "",
    ) -> None:
        """Fine-tune a causal language model and evaluate it against its base.

        Args:
            train_data_uri: Raw training records: a file, glob or gs:// URI of JSONL, JSON, CSV or Parquet. For scheduled runs it may contain the schedule-time placeholder so each run reads its own window.
            base_model: Model to fine-tune: a local path, gs:// URI of a Hugging Face model directory, a hub id, or "latest-registered" to continue from the latest version of registered_model.
            backend: Where training runs: "local" (torchrun agents on this machine), "gke" (Kubeflow PyTorchJob) or "vertex" (Vertex AI CustomJob).
            data_kind: "instruction" for prompt/response or chat messages records, "text" for plain causal-LM text.
            seq_len: Tokens per packed training row.
            eval_fraction: Fraction of records held out for evaluation (deterministic by content hash).
            preprocess_runner: Beam runner for preprocessing: "DirectRunner" (in the task) or "DataflowRunner" (workers run the project image; temp and staging files under work_uri).
            dataflow_options: Extra Dataflow options, e.g. {"max_num_workers": 20, "machine_type": "n2-standard-8", "subnetwork": "..."}.
            dataflow_service_account: Service-account email the Dataflow workers run as; empty uses the project's Compute Engine default service account.
            nodes: Training nodes (torchrun agents / PyTorchJob replicas / CustomJob replicas).
            nproc_per_node: Training processes per node; 0 starts one per accelerator (accelerator_count) on GPU machines, 1 on CPU.
            rdzv_backend: Rendezvous backend: "etcd-v3" (per-run etcd, works on etcd 3.4+), "etcd-v2" or "c10d".
            max_steps: Optimizer steps to train for.
            learning_rate: Peak learning rate (AdamW, warmup then cosine decay).
            trainer_overrides: Any other trainer setting by name, e.g. {"micro_batch_size": 8, "lora_rank": 16}.
            project: Google Cloud project id (cloud backends, Dataflow, Model Registry).
            region: Google Cloud region for Vertex AI and Dataflow.
            work_uri: gs:// prefix for run files shared between steps (Dataflow temp, checkpoints); cloud runs only.
            namespace: Kubernetes namespace for the per-run etcd and the PyTorchJob (gke backend).
            gke_cluster: GKE cluster "projects/P/locations/L/clusters/C" when Vertex AI Pipelines drives GKE; empty means the cluster the pipeline runs in.
            machine_type: Machine type per node on Vertex AI (e.g. a3-highgpu-8g).
            accelerator_type: Accelerator per node: a Vertex name such as NVIDIA_H100_80GB; on GKE the matching gke-accelerator node selector is used.
            accelerator_count: Accelerators per node (0 for CPU-only training).
            service_account: Identity of the training job. Vertex: a service-account email (empty: the Vertex AI Custom Code Service Agent). GKE: the Kubernetes service account of the PyTorchJob pods, bound to a Google service account by Workload Identity (required).
            hf_token_secret: Name of the Kubernetes Secret (key "token", GKE) or Secret Manager secret (Vertex, read at run time) holding a Hugging Face token; optional (public models need none); never the token itself.
            eval_accelerator_type: Accelerator of the evaluation step on Vertex AI (e.g. NVIDIA_L4, NVIDIA_A100_80GB for 30B+ models); on KFP any GPU node serves it. Evaluation runs in bf16 on a GPU.
            eval_accelerator_count: GPUs for the evaluation step (at least 1).
            max_eval_examples: Held-out prompts to generate answers for (bounds evaluation time).
            min_loss_improvement: Quality gate: the tuned eval loss must be below the base's by at least this much.
            min_exact_match: Quality gate: the tuned model's exact-match rate on held-out prompts must be at least this.
            register_model: Upload the tuned model to Vertex AI Model Registry when it passes the gate.
            registered_model: Vertex AI model (resource name or display name) to add versions to or take "latest-registered" from.
            champion_model: Optional model the tuned one must also beat: a model URI, or "latest-registered" for the newest version of registered_model (recurring fine-tunes); empty skips the comparison.
            serving_image: Serving container image (pinned tag) for the registered model, e.g. a vLLM or TGI image from Vertex AI Model Garden; required when register_model is true.
        """
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        cleanup_task = c.cleanup(
            backend=backend,
            run_id=run_id,
            namespace=namespace,
            gke_cluster=gke_cluster,
            project=project,
            region=region,
        ).set_caching_options(False)
        cleanup_task.set_display_name("cleanup")

        with dsl.ExitHandler(cleanup_task, name="fine-tune"):
            validated = c.validate_inputs(
                target=target,
                run_id=run_id,
                backend=backend,
                train_data_uri=train_data_uri,
                data_kind=data_kind,
                base_model=base_model,
                seq_len=seq_len,
                eval_fraction=eval_fraction,
                preprocess_runner=preprocess_runner,
                nodes=nodes,
                nproc_per_node=nproc_per_node,
                rdzv_backend=rdzv_backend,
                max_steps=max_steps,
                learning_rate=learning_rate,
                project=project,
                region=region,
                work_uri=work_uri,
                registered_model=registered_model,
                register_model=register_model,
                serving_image=serving_image,
                max_eval_examples=max_eval_examples,
                schedule_time=dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER
                if schedule_time
                else "",
                champion_model=champion_model,
                accelerator_count=accelerator_count,
                service_account=service_account,
                dataflow_service_account=dataflow_service_account,
                hf_token_secret=hf_token_secret,
                eval_accelerator_type=eval_accelerator_type,
                eval_accelerator_count=eval_accelerator_count,
            ).set_caching_options(False)  # "latest-registered" must be looked up on every run
            prep = c.preprocess(
                train_data_uri=validated.outputs["train_data_uri"],
                tokenizer=validated.outputs["base_model"],
                data_kind=data_kind,
                seq_len=seq_len,
                eval_fraction=eval_fraction,
                runner=preprocess_runner,
                project=project,
                region=region,
                work_uri=work_uri,
                run_id=run_id,
                dataflow_options=dataflow_options,
                dataflow_service_account=dataflow_service_account,
                hf_token_secret=hf_token_secret,
            )
            prep.set_retry(num_retries=2, backoff_duration="30s", backoff_factor=2.0)
            etcd = c.etcd_up(
                backend=backend,
                run_id=run_id,
                rdzv_backend=rdzv_backend,
                namespace=namespace,
                gke_cluster=gke_cluster,
                project=project,
            ).set_caching_options(False)
            etcd.after(prep)  # start the per-run etcd only once its data is ready
            etcd.set_retry(num_retries=2, backoff_duration="10s")
            trained = c.train(
                backend=backend,
                run_id=run_id,
                base_model=validated.outputs["base_model"],
                dataset=prep.outputs["dataset"],
                rdzv_endpoint=etcd.output,
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
            ).set_caching_options(False)
            # Safe to retry: the trainer resumes from its latest complete checkpoint.
            trained.set_retry(num_retries=1, backoff_duration="60s")
            evaluated = c.evaluate(
                base_model=validated.outputs["base_model"],
                tuned_model=trained.outputs["model"],
                dataset=prep.outputs["dataset"],
                max_eval_examples=max_eval_examples,
                min_loss_improvement=min_loss_improvement,
                min_exact_match=min_exact_match,
                champion_model=validated.outputs["champion_model"],
                project=project,
                hf_token_secret=hf_token_secret,
            )
            if target == "vertex":
                evaluated.set_accelerator_type(eval_accelerator_type)
            elif target == "kfp":
                evaluated.set_accelerator_type(GKE_EVAL_GPU)
            if target != "local":
                evaluated.set_accelerator_limit(eval_accelerator_count)
            with dsl.If(evaluated.outputs["passed"] == True, name="passed-gate"):  # noqa: E712, SIM117
                with dsl.If(register_model == True, name="register-enabled"):  # noqa: E712
                    registered = c.register(
                        tuned_model=trained.outputs["model"],
                        run_id=run_id,
                        project=project,
                        region=region,
                        registered_model=registered_model,
                        serving_image=serving_image,
                    ).set_caching_options(False)

        for task in (cleanup_task, validated, prep, etcd, trained, evaluated, registered):
            cpu, memory = STEP_RESOURCES[task.name]
            task.set_cpu_limit(cpu).set_memory_limit(memory)
        if target == "kfp":
            _apply_kubernetes_settings(
                [cleanup_task, validated, prep, etcd, trained, evaluated],
                hf_token_secret=HF_TOKEN_SECRET,
            )

    return fine_tune


def _apply_kubernetes_settings(tasks: list[Any], hf_token_secret: str) -> None:
    """kfp-kubernetes settings for KFP on GKE (never in the Vertex target)."""
    from kfp import kubernetes

    from components.launchers.gke import IMAGE_UID

    for task in tasks:
        # The image runs as root for Dataflow's worker boot; task pods use its `llmft` user.
        kubernetes.set_security_context(
            task, run_as_user=IMAGE_UID, run_as_group=IMAGE_UID, run_as_non_root=True
        )
        kubernetes.add_pod_label(task, "app.kubernetes.io/managed-by", "llmft")
        kubernetes.add_pod_label(task, "app.kubernetes.io/part-of", PIPELINE_NAME)
        # Optional: a missing Secret is fine for public base models.
        kubernetes.use_secret_as_env(
            task,
            secret_name=hf_token_secret,
            secret_key_to_env={"token": "HF_TOKEN"},
            optional=True,
        )
    # The launcher steps only wait on cluster jobs; bound them so a lost watch cannot hang a run.
    kubernetes.set_timeout(tasks[4], 7 * 24 * 3600)


fine_tune = build_fine_tune("vertex")
