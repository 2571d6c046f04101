"""Training must fit its GPUs (components/preflight/train_fit.py): a Llama-3-8B-shaped config (config.json
only: sized on the meta device) against the platform facts' GPU memory, by the CLI's checks and
directly; every fix a refusal names is itself checked to pass."""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import pytest
from test_cli_errors import _DRY_RUN_BACKENDS, _DRY_RUN_PARAMS, assert_user_error, llmft

from components.params.run_params import RunParams
from components.preflight.train_fit import training_fit_error

LLAMA3_8B_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
"""meta-llama/Meta-Llama-3-8B's shape (trainer/memory_model.py's LLAMA3_8B)."""
ONE_L4 = {
    "backend": "vertex",
    "accelerator_type": "NVIDIA_L4",
    "accelerator_count": 1,
    "machine_type": "g2-standard-8",
    "nodes": 1,
    "seq_len": 2048,
}


@pytest.fixture(scope="module")
def llama3_8b(tmp_path_factory: pytest.TempPathFactory) -> str:
    model = tmp_path_factory.mktemp("llama3-8b")
    (model / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    return str(model)


def run(**changes: object) -> RunParams:
    return dataclasses.replace(RunParams(), **changes)  # type: ignore[arg-type]


def test_a_full_fine_tune_of_8b_on_one_l4_is_refused_with_what_would_fit(llama3_8b: str) -> None:
    error = training_fit_error(run(**ONE_L4), llama3_8b, remote=False)
    assert error is not None
    # 8.03e9 parameters: 4 bytes each of fp32 weights, 8 of AdamW moments, and 4 of gradients,
    # which are freed after each step: the larger of them and the activations counts.
    weights, moments, activations, gradients = (
        float(x)
        for x in re.search(
            r"weights ([\d.]+), optimizer state ([\d.]+), the larger of activations ([\d.]+) "
            r"and gradients ([\d.]+)",
            error,
        ).groups()
    )
    assert weights == pytest.approx(8.03e9 * 4 / 2**30, abs=0.1)
    assert moments == pytest.approx(8.03e9 * 8 / 2**30, abs=0.1)
    assert gradients == pytest.approx(8.03e9 * 4 / 2**30, abs=0.1)
    total = float(re.search(r"at least ([\d.]+) GiB", error).group(1))
    assert total == pytest.approx(weights + moments + max(activations, gradients), abs=0.15)
    assert error.startswith("training does not fit NVIDIA_L4 (24 GiB)")
    assert (
        'quantize_base=nf4 with trainer_overrides {"lora_rank": 16, "activation_checkpointing": '
        "true}" in error
    )
    # The QLoRA it names (with activation checkpointing) passes.
    qlora = run(
        **ONE_L4,
        quantize_base="nf4",
        trainer_overrides={"lora_rank": 16, "activation_checkpointing": True},
    )
    assert training_fit_error(qlora, llama3_8b, remote=False) is None
    # And so does the GPU count it names: 2^k GPUs of the same kind, 8 to a g2-standard-96 node.
    gpus = int(re.search(r"(\d+) GPUs", error).group(1))
    assert gpus == 8
    sharded = run(
        **{**ONE_L4, "accelerator_count": gpus, "machine_type": "g2-standard-96"},
        trainer_overrides={"activation_checkpointing": True},
    )
    assert training_fit_error(sharded, llama3_8b, remote=False) is None


def test_lora_needing_only_checkpointing_is_told_so(llama3_8b: str) -> None:
    h100 = {**ONE_L4, "accelerator_type": "NVIDIA_H100_80GB", "machine_type": "a3-highgpu-1g"}
    lora = run(**{**h100, "seq_len": 8192}, trainer_overrides={"lora_rank": 16})
    error = training_fit_error(lora, llama3_8b, remote=False)
    assert (
        error is not None
        and 'it fits with trainer_overrides {"activation_checkpointing": true}' in error
    )
    checkpointed = run(
        **{**h100, "seq_len": 8192},
        trainer_overrides={"lora_rank": 16, "activation_checkpointing": True},
    )
    assert training_fit_error(checkpointed, llama3_8b, remote=False) is None


TINYLLAMA_CONFIG = {
    **LLAMA3_8B_CONFIG,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}
"""The 1.1B Llama of benchmarks/gpu_check.py (TinyLlama's shape)."""
ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize(
    "overrides, seq_len, measured_gb",
    [
        # docs/performance.md, one H200, torch.cuda.max_memory_allocated of the step
        ({"micro_batch_size": 4}, 4096, 43.5),  # full fine-tune (every token a target)
        (
            {
                "micro_batch_size": 4,
                "lora_rank": 16,
                "lora_target_modules": ALL_PROJECTIONS,
                "quantize_base": "nf4",
            },
            2048,
            18.4,
        ),  # QLoRA
    ],
)
def test_the_refused_part_is_below_what_the_gpu_measured(
    overrides: dict, seq_len: int, measured_gb: float
) -> None:
    """What the check refuses on must be memory the run really needs: for both runs measured on
    a GPU, the refused part is below the measured peak (the whole estimate may be above it)."""
    from transformers import AutoConfig

    from components.preflight.model_size import size_of
    from components.preflight.train_fit import Plan, fit_of
    from trainer.config import TrainConfig
    from trainer.memory_model import ModelShape

    config = AutoConfig.for_model(**TINYLLAMA_CONFIG)
    shape = ModelShape.from_hf_config(config.to_dict(), size_of(config).parameters)
    trainer = TrainConfig(model="m", data="d", output="o", **overrides)
    fit = fit_of(shape, Plan(trainer, world_size=1, seq_len=seq_len), 141 * 2**30)
    assert fit.lower_bound < measured_gb * 1e9 < fit.estimate.total * 1.1


def test_replicated_models_are_estimated_whole_on_every_gpu(llama3_8b: str) -> None:
    """DDP (data_parallel=replicate) holds the whole model, gradients and AdamW state on every
    GPU: 16 H100s do not help it, sharding does (review F2)."""
    h100s = {**ONE_L4, "accelerator_type": "NVIDIA_H100_80GB", "machine_type": "a3-highgpu-8g"}
    h100s.update(accelerator_count=8, nodes=2)
    replicated = {"data_parallel": "replicate", "activation_checkpointing": True}
    error = training_fit_error(run(**h100s, trainer_overrides=replicated), llama3_8b, remote=False)
    assert error is not None and '"data_parallel": "shard"' in error
    sharded = {**replicated, "data_parallel": "shard"}
    assert (
        training_fit_error(run(**h100s, trainer_overrides=sharded), llama3_8b, remote=False) is None
    )


def test_accumulated_gradients_are_held_with_the_activations(llama3_8b: str) -> None:
    """With gradient accumulation the gradients live through the next micro-batch's forward:
    the refused part holds both."""
    one = {**ONE_L4, "accelerator_type": "NVIDIA_H100_80GB", "machine_type": "a3-highgpu-1g"}
    error = training_fit_error(
        run(**one, trainer_overrides={"grad_accum_steps": 2}), llama3_8b, remote=False
    )
    assert error is not None and "activations" in error and "the larger of" not in error


def test_a_run_that_fits_only_without_the_allowance_is_warned_not_refused(
    llama3_8b: str, caplog: pytest.LogCaptureFixture
) -> None:
    """16 H100s shard the 8B's weights and optimizer state; at micro-batch 3 x 4096 the
    activations fit (72 GiB of 80), the logits of a 128k vocabulary with every position a target
    and the allowance would not (~100 GiB): real data has far fewer targets, so only a warning."""
    two_nodes = {**ONE_L4, "accelerator_type": "NVIDIA_H100_80GB", "machine_type": "a3-highgpu-8g"}
    params = run(
        **{**two_nodes, "accelerator_count": 8, "nodes": 2, "seq_len": 4096},
        trainer_overrides={"micro_batch_size": 3},
    )
    with caplog.at_level(logging.WARNING, logger="components.preflight.train_fit"):
        assert training_fit_error(params, llama3_8b, remote=False) is None
    assert "training may not fit NVIDIA_H100_80GB" in caplog.text


@pytest.mark.parametrize(
    "changes, model",
    [
        ({"backend": "local", "accelerator_count": 0}, "local"),  # CPU: nothing to fit
        ({}, "meta-llama/Meta-Llama-3-8B"),  # a hub id: no config.json to read here
        ({}, "gs://b/m"),  # read inside the pipeline, with its credentials
        ({"accelerator_type": "NVIDIA_GB200"}, "local"),  # a GPU the facts lack (review P5)
    ],
)
def test_what_cannot_be_sized_here_is_left_to_the_run(
    llama3_8b: str, changes: dict, model: str
) -> None:
    base_model = llama3_8b if model == "local" else model
    assert training_fit_error(run(**{**ONE_L4, **changes}), base_model, remote=False) is None


def test_llmft_run_dry_run_refuses_it_before_anything_starts(llama3_8b: str) -> None:
    # A full fine-tune, asked for explicitly: the cloud targets' first-run default is QLoRA.
    params = [f"{k}={v}" for k, v in ONE_L4.items() if k != "backend"]
    params += ["quantize_base=none", "trainer_overrides={}"]
    extra = [arg for change in [*params, f"base_model={llama3_8b}"] for arg in ("--param", change)]
    result = llmft("run", *_DRY_RUN_BACKENDS["vertex"], *_DRY_RUN_PARAMS, *extra, "--dry-run")
    assert_user_error(result, "training does not fit NVIDIA_L4", "quantize_base=nf4")
    assert len(result.output.strip().splitlines()) == 1
    fixed = [
        "--param", "quantize_base=nf4",
        "--param", 'trainer_overrides={"lora_rank": 16, "activation_checkpointing": true}',
    ]  # fmt: skip
    result = llmft(
        "run", *_DRY_RUN_BACKENDS["vertex"], *_DRY_RUN_PARAMS, *extra, *fixed, "--dry-run"
    )
    assert result.exit_code == 0, result.output


@pytest.mark.integration  # the Hub's fake on loopback; a fresh `llmft` process
def test_a_hub_model_is_sized_from_its_config_json_alone(tmp_path) -> None:
    """`base_model=owner/name`: config.json is downloaded (with the token), nothing else; a gated
    model without a token, or with one that has no access, is left to the run with a warning
    saying which."""
    from fakes.hf_hub import FakeHub
    from test_cli_errors import _fresh_llmft

    repo = "meta-llama/Meta-Llama-3-8B"
    params = [f"{k}={v}" for k, v in ONE_L4.items() if k != "backend"]
    args = [arg for p in [*params, f"base_model={repo}"] for arg in ("--param", p)]
    # The model's size comes from the Hub here, so the shared dry-run size is left out.
    sized = [a for pair in zip(_DRY_RUN_PARAMS[::2], _DRY_RUN_PARAMS[1::2], strict=True)
             if not pair[1].startswith("model_parameters=") for a in pair]  # fmt: skip
    command = ["run", *_DRY_RUN_BACKENDS["vertex"], *sized, *args, "--dry-run"]
    files = {"config.json": json.dumps(LLAMA3_8B_CONFIG).encode(), "model.safetensors": b"x"}
    with FakeHub({repo: files}, gated={repo: "hf_test"}) as hub:
        hub_env = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}

        def llmft_run(HF_HOME: str = str(tmp_path / "hf"), HF_TOKEN: str = ""):
            env = {**hub_env, "HF_HOME": HF_HOME, "HF_TOKEN": HF_TOKEN}  # "": no token
            return _fresh_llmft(*command, env=env)

        refused = llmft_run(HF_TOKEN="hf_test")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        error = refused.stdout + refused.stderr
        assert "error: training does not fit NVIDIA_L4" in error, error
        assert hub.downloads == [(f"/{repo}/resolve/main/config.json", "Bearer hf_test")]

        for token, why in [({}, "and no token here"), ({"HF_TOKEN": "hf_other"}, "no access")]:
            # A new cache each time: nothing cached either.
            unchecked = llmft_run(HF_HOME=str(tmp_path / f"hf-{len(token)}"), **token)
            output = unchecked.stdout + unchecked.stderr
            assert unchecked.returncode == 0, output
            read = f"fit not checked: cannot read the config.json of {repo} (a gated model"
            assert read in output and why in output, output

        # An outage: one request (huggingface_hub alone would retry it 5 times, up to 60 s each),
        # kept for the estimate too.
        hub.unavailable, hub.requests[:] = True, []
        unchecked = llmft_run(HF_HOME=str(tmp_path / "hf-outage"), HF_TOKEN="hf_test")
        output = unchecked.stdout + unchecked.stderr
        assert unchecked.returncode == 0, output
        assert "503" in output and "training time unknown" in output, output
        assert [r.path for r in hub.requests if "/resolve/" in r.path] == [
            f"/{repo}/resolve/main/config.json"
        ]
