"""Training must fit its GPUs (components/train_fit.py): a Llama-3-8B-shaped config (config.json
only: sized on the meta device) against the platform facts' GPU memory, by the CLI's checks and
directly; every fix a refusal names is itself checked to pass."""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import pytest
from test_cli_errors import _DRY_RUN_BACKENDS, _DRY_RUN_PARAMS, assert_user_error, llmft

from components.run_params import RunParams
from components.train_fit import training_fit_error

pytestmark = pytest.mark.unit

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
    # 8.03e9 parameters x (4 bytes of fp32 weights + 12 of gradient and AdamW moments) alone.
    weights, trainable = (
        float(x)
        for x in re.findall(
            r"weights ([\d.]+), gradients and "
            r"optimizer state ([\d.]+)",
            error,
        )[0]
    )
    assert weights == pytest.approx(8.03e9 * 4 / 2**30, abs=0.1)
    assert trainable == pytest.approx(8.03e9 * 12 / 2**30, abs=0.1)
    assert error.startswith("training does not fit NVIDIA_L4 (24 GiB)")
    assert (
        "quantize_base=nf4, lora_rank=16" in error and "GPUs (nodes x accelerator_count)" in error
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
        and "it fits with trainer_overrides activation_checkpointing=true" in error
    )
    checkpointed = run(
        **{**h100, "seq_len": 8192},
        trainer_overrides={"lora_rank": 16, "activation_checkpointing": True},
    )
    assert training_fit_error(checkpointed, llama3_8b, remote=False) is None


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
    with caplog.at_level(logging.WARNING, logger="components.train_fit"):
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
    params = [f"{k}={v}" for k, v in ONE_L4.items() if k != "backend"]
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
