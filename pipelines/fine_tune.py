"""The fine-tune pipeline: one source, two compile targets.

    validate_inputs -> If(proceed: new data) preprocess -> etcd_up -> train -> evaluate
        -> If(passed and register): register -> If(deploy_endpoint): deploy
        (local: deploy(gate_passed), serving on this machine when deploy_endpoint is set)
    all inside dsl.ExitHandler(cleanup)

`build_fine_tune(target)` returns the pipeline for a target:
- "vertex": a single YAML document (Vertex AI Pipelines cannot parse kfp-kubernetes' second
  document); the launchers themselves reach GKE or Vertex CustomJob. Defaults: backend=vertex,
  Dataflow preprocessing.
- "kfp": KFP on GKE, with kfp-kubernetes settings for the task pods (the HF token Secret as env,
  pod labels, timeouts). Defaults: backend=gke, Dataflow preprocessing, training pods as the
  `llmft-trainer` Kubernetes service account (docs/deploy/rbac.yaml).
- "local": what `llmft run --backend local` runs through kfp.local (never compiled).
Each target's defaults (`TARGET_DEFAULTS` in components/params/run_params.py) are what a run launched
from the console with only data, base model, project, bucket and Dataflow account filled in needs
(tests/test_compile.py checks it); `validate_inputs` receives the target and refuses a backend
that cannot run there.

Every task sets CPU/memory (Vertex runs a task without them on a 4 vCPU / 16 GB machine);
evaluation gets an accelerator (`eval_accelerator_type`, `eval_accelerator_count`) so a
multi-billion-parameter model is scored in bf16 on a GPU.

The parameters, their defaults and their console descriptions come from one schema,
`components.params.run_params.RunParams`: the pipeline function's signature and its docstring `Args:` are
generated from it (pipelines/pipeline_interface.py; KFP reads both), so adding a parameter is one
field there.

Resource names and labels come from the run id (`dsl.PIPELINE_JOB_ID_PLACEHOLDER`): the exit
handler cannot consume the guarded tasks' outputs, so cleanup finds what the run made by label.
Steps with side effects never use the cache.
"""

import contextlib
from collections.abc import Callable
from typing import Any

from kfp import dsl

from components import kfp_components as c
from components.launchers.pytorchjob import IMAGE_UID
from components.launchers.vocab import DEADLINE_GRACE_S
from components.params.param_checks import TARGETS as BUILD_TARGETS
from components.params.run_params import TRAIN_TIMEOUT_MAX_S, RunParams, defaults
from components.params.step_params import inputs_of
from components.platform.task_resources import KFP_STEP_REQUESTS, STEP_RESOURCES
from components.serving.mlflow_tracking import KFP_TRACKING_TOKEN_SECRET
from pipelines.pipeline_interface import pipeline_docstring, pipeline_signature
from trainer.cuda_guard import EXPECT_CUDA_ENV
from trainer.tracking import TOKEN_ENV

PIPELINE_NAME = "llmft-fine-tune"
TARGETS = tuple(target for target in BUILD_TARGETS if target != "local")
"""The compile targets (compiled/fine_tune.<target>.yaml); "local" is built, never compiled."""
DESCRIPTION = (
    "Fine-tune a causal LM: Beam preprocessing to packed shards, a per-run etcd, multi-node "
    "FSDP2 training (local torchrun agents, PyTorchJob on GKE or Vertex CustomJob), "
    "before/after evaluation with a quality gate, optional Model Registry upload, and "
    "cleanup of everything the run created."
)
GKE_EVAL_GPU = "nvidia.com/gpu"
"""KFP on Kubernetes takes the accelerator as a resource name; Vertex as a type (NVIDIA_L4)."""


def build_fine_tune(target: str = "vertex", schedule_time: bool = True) -> Callable[..., Any]:
    """The `fine_tune` pipeline function for a target ("vertex", "kfp" or "local").

    Args:
        target: "vertex", "kfp" or "local".
        schedule_time: pass the run's schedule time to validate_inputs (for `train_data_uri`
            windows). kfp.local cannot resolve that placeholder (it crashes on it), so the local
            target never passes it: there is no schedule locally anyway.
    """
    if target not in BUILD_TARGETS:
        raise ValueError(f"target={target!r}: choose one of {', '.join(BUILD_TARGETS)}")
    schedule_time = schedule_time and target != "local"

    def fine_tune(*args: Any) -> None:
        p = RunParams(*args)  # KFP passes one channel per parameter, in signature order
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        cleanup_task = _cleanup(p, run_id)
        with dsl.ExitHandler(cleanup_task, name="fine-tune"):
            validated = _validate(p, run_id, target, schedule_time)
            with _unless_skipped(validated, target):
                prep = _preprocess(p, run_id, validated)
                etcd = _etcd_up(p, run_id, prep)
                trained = _train(p, target, run_id, validated, prep, etcd, schedule_time)
                evaluated = _evaluate(p, target, run_id, validated, prep, trained)
                registered = _register(p, run_id, validated, evaluated, trained, target)

        tasks = [cleanup_task, validated, prep, etcd, trained, evaluated]
        for task in tasks + [t for t in registered if t is not None]:
            cpu, memory = STEP_RESOURCES[task.name]
            task.set_cpu_limit(cpu).set_memory_limit(memory)
            if target == "kfp" and task.name in KFP_STEP_REQUESTS:
                cpu, memory = KFP_STEP_REQUESTS[task.name]
                task.set_cpu_request(cpu).set_memory_request(memory)
        if target == "kfp":
            _apply_kubernetes_settings(
                [cleanup_task, validated, prep, etcd, trained, evaluated],
                hf_token_secret=defaults()["hf_token_secret"],
                tracking_token_secret=KFP_TRACKING_TOKEN_SECRET,
            )

    fine_tune.__signature__ = pipeline_signature(target)  # type: ignore[attr-defined]
    fine_tune.__doc__ = pipeline_docstring(
        "Fine-tune a causal language model and evaluate it against its base."
    )
    return dsl.pipeline(name=PIPELINE_NAME, description=DESCRIPTION)(fine_tune)


# -- one function per stage of the DAG; `p` holds the pipeline's parameter channels ------------


def _cleanup(p: RunParams, run_id: str) -> Any:
    """The exit handler: deletes everything labelled with the run id, whatever happened."""
    cleanup_task = c.cleanup(**inputs_of(p, "cleanup"), run_id=run_id)
    cleanup_task.set_caching_options(False)
    cleanup_task.set_display_name("cleanup")
    return cleanup_task


def _validate(p: RunParams, run_id: str, target: str, schedule_time: bool) -> Any:
    """First step: every parameter checked (and "latest-registered" resolved) before work starts."""
    return c.validate_inputs(
        **inputs_of(p, "validate_inputs"),
        target=target,
        run_id=run_id,
        schedule_time=dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER if schedule_time else "",
    ).set_caching_options(False)  # "latest-registered" must be looked up on every run


def _unless_skipped(validated: Any, target: str) -> Any:
    """The rest of the run, unless validate found the schedule's window unchanged
    (`min_new_records`: "skipped: nothing new", no Dataflow job, no GPU). The local build
    always proceeds: its runner counts every step (pipelines/local_progress.py)."""
    if target == "local":
        return contextlib.nullcontext()
    return dsl.If(validated.outputs["proceed"] == True, name="new-data")  # noqa: E712


def _preprocess(p: RunParams, run_id: str, validated: Any) -> Any:
    """Beam: raw records to packed shards, in the task (DirectRunner) or on Dataflow; the mix
    (with replay) is validate's."""
    # No retry: Beam and Dataflow retry failed bundles themselves; what fails the step
    # (bad input, a rejected-fraction over the limit, no training rows) is permanent.
    return c.preprocess(
        **inputs_of(
            p,
            "preprocess",
            train_data_uri=validated.outputs["train_data_uri"],
            base_model=validated.outputs["base_model"],
            train_data_mix=validated.outputs["train_data_mix"],
        ),
        run_id=run_id,
    )


def _etcd_up(p: RunParams, run_id: str, prep: Any) -> Any:
    """The run's rendezvous etcd, started only once the data is ready."""
    etcd = c.etcd_up(**inputs_of(p, "etcd_up"), run_id=run_id).set_caching_options(False)
    etcd.after(prep)  # start the per-run etcd only once its data is ready
    etcd.set_retry(num_retries=2, backoff_duration="10s")
    return etcd


def _train(
    p: RunParams,
    target: str,
    run_id: str,
    validated: Any,
    prep: Any,
    etcd: Any,
    schedule_time: bool,
) -> Any:
    """Launch and follow the training job on the chosen backend."""
    trained = c.train(
        **inputs_of(p, "train", base_model=validated.outputs["base_model"]),
        run_id=run_id,
        dataset_uri=prep.outputs["dataset_uri"],  # by URI: not downloaded into the launcher pod
        rdzv_endpoint=etcd.output,
        budget_timeout_s=validated.outputs["budget_timeout_s"],
        schedule_time=dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER if schedule_time else "",
    ).set_caching_options(False)
    if target != "local":
        # Safe to retry: the trainer resumes from its latest complete checkpoint. Not locally:
        # kfp.local retries a task that Ctrl-C cancelled (it cannot tell the two apart), so the
        # run would start training again after the user stopped it.
        trained.set_retry(num_retries=1, backoff_duration="60s")
    return trained


def _evaluate(
    p: RunParams, target: str, run_id: str, validated: Any, prep: Any, trained: Any
) -> Any:
    """Base vs tuned with the quality gate, on a GPU except in the local build."""
    evaluated = c.evaluate(
        **inputs_of(
            p,
            "evaluate",
            base_model=validated.outputs["base_model"],
            champion_model=validated.outputs["champion_model"],
            # The declared machine (memory check before loading) exists on Vertex only; on KFP any
            # GPU node serves and locally this machine's devices do: both are measured at run time.
            eval_accelerator_type=p.eval_accelerator_type if target == "vertex" else "",
            eval_accelerator_count=p.eval_accelerator_count if target == "vertex" else 0,
        ),
        tuned_model=trained.outputs["model"],
        dataset=prep.outputs["dataset"],
        run_id=run_id,
        schedule_record=validated.outputs["schedule_record"],
    )
    if target == "vertex":
        evaluated.set_accelerator_type(p.eval_accelerator_type)
    elif target == "kfp":
        evaluated.set_accelerator_type(GKE_EVAL_GPU)
    if target != "local":
        evaluated.set_accelerator_limit(p.eval_accelerator_count)
        # Given a GPU (validation requires at least 1 in the cloud): stop if torch sees none.
        evaluated.set_env_variable(EXPECT_CUDA_ENV, "1")
    return evaluated


def _register(
    p: RunParams, run_id: str, validated: Any, evaluated: Any, trained: Any, target: str
) -> tuple[Any, Any]:
    """When the gate passed: upload to the Model Registry (if registration is on), then deploy
    and smoke-test it (if `deploy_endpoint` is set). A local run cannot register; it serves the
    exported model on its own machine instead. Returns (register task, deploy task), None for
    a task this target does not have."""
    deploy_args = dict(
        **inputs_of(p, "deploy"),
        model_uri=trained.outputs["model_uri"],  # by URI: nothing downloaded into the pod
        run_id=run_id,
        local=target == "local",
    )
    if target == "local":
        # No dsl.If: kfp.local (2.17) cannot resolve a task output in a condition inside the
        # exit handler ("Could not resolve parent input: evaluate-passed"; the condition is then
        # false). The step gets the gate's verdict and does nothing unless it passed and
        # deploy_endpoint is set.
        deployed = c.deploy(**deploy_args, gate_passed=evaluated.outputs["passed"])
        return None, deployed.set_caching_options(False)
    with dsl.If(evaluated.outputs["passed"] == True, name="passed-gate"):  # noqa: E712, SIM117
        with dsl.If(p.register_model == True, name="register-enabled"):  # noqa: E712
            registered = c.register(
                **inputs_of(p, "register", base_model=validated.outputs["base_model"]),
                model_uri=trained.outputs["model_uri"],  # by URI: the registry reads gs://
                metrics=evaluated.outputs["metrics"],
                run_id=run_id,
            ).set_caching_options(False)
            with dsl.If(p.deploy_endpoint != "", name="deploy-enabled"):
                deployed = c.deploy(
                    **deploy_args, vertex_model=registered.outputs["vertex_model"]
                ).set_caching_options(False)
            return registered, deployed


def _apply_kubernetes_settings(
    tasks: list[Any], hf_token_secret: str, tracking_token_secret: str
) -> None:
    """kfp-kubernetes settings for KFP on GKE (never in the Vertex target)."""
    from kfp import kubernetes

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
        # The Secret's name is fixed when compiling, as the HF token's: validate_inputs refuses
        # another tracking_token_secret on KFP, and a missing Secret when one is named.
        kubernetes.use_secret_as_env(
            task,
            secret_name=tracking_token_secret,
            secret_key_to_env={"token": TOKEN_ENV},
            optional=True,
        )
    # The launcher steps only wait on cluster jobs; bound them so a lost watch cannot hang a run.
    # Above the longest train_timeout_s plus the job's grace: the step cancels the job first.
    kubernetes.set_timeout(tasks[4], TRAIN_TIMEOUT_MAX_S + 2 * DEADLINE_GRACE_S)


fine_tune = build_fine_tune("vertex")
