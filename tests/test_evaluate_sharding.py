"""Evaluation over several devices: accelerate's device map, tested on CPU with two shards.

Without GPUs, the second shard is accelerate's disk offload ("disk": weights streamed in by the
same AlignDevicesHook that moves activations between GPUs), so the model really runs split in two
with hooks between the halves. Its logits, eval loss and harness scores must equal the
single-device ones (to 1e-5). Also: single-device placement on CPU is unchanged, and a model too
big for the evaluation machine is refused by `llmft evaluate` with exit code 2 and one error line
naming a machine that would fit, before any model loads.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from eval_fixtures import build_eval_dataset, one_torch_thread

from components.evaluation.evaluate import run_evaluation
from components.evaluation.harness import HarnessSettings
from components.evaluation.loading import loaded_model, plan_placement
from components.evaluation.request import EvaluationRequest


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def two_shards(model_dir: Path) -> dict[str, str]:
    """First half of the decoder layers (and the embeddings) on "cpu", the rest on "disk"."""
    config = json.loads((model_dir / "config.json").read_text())
    layers = config["num_hidden_layers"]
    device_map = {"model.embed_tokens": "cpu"}
    for i in range(layers):
        device_map[f"model.layers.{i}"] = "cpu" if i < layers // 2 else "disk"
    device_map |= {"model.norm": "disk", "model.rotary_emb": "disk", "lm_head": "disk"}
    return device_map


@pytest.fixture(scope="module")
def data(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, sample_data_dir: Path
) -> Path:
    from transformers import AutoTokenizer

    return build_eval_dataset(
        tmp_path_factory.mktemp("sharding_data"), AutoTokenizer.from_pretrained(tiny_model_dir),
        sample_data_dir, n_train=20, n_eval=8, seq_len=128,
    )  # fmt: skip


def test_single_device_placement_on_cpu_is_unchanged() -> None:
    import torch

    placement = plan_placement()
    assert placement.device == torch.device("cpu") and placement.dtype == torch.float32
    assert placement.device_map is None and placement.max_memory is None
    sharded = plan_placement(device_map={"model": "cpu", "lm_head": "disk"})
    assert sharded.device == torch.device("cpu") and sharded.dtype == torch.float32
    with pytest.raises(ValueError, match="device_map is empty"):
        plan_placement(device_map={})


def test_two_shards_give_the_single_device_logits(tiny_model_dir: Path) -> None:
    import torch

    ids = torch.randint(0, 4000, (3, 48), generator=torch.Generator().manual_seed(0))
    with loaded_model(str(tiny_model_dir), device="cpu") as single, torch.no_grad():
        assert single.device_map is None
        expected = single.model(input_ids=ids, use_cache=False).logits
    with loaded_model(str(tiny_model_dir), device_map=two_shards(tiny_model_dir)) as lm:
        with torch.no_grad():
            logits = lm.model(input_ids=ids.to(lm.device), use_cache=False).logits
        assert set(lm.device_map.values()) == {"cpu", "disk"}
        assert "sharded over 2 devices: cpu, disk" in lm.describe()
        # The second half's weights are not resident: accelerate's hooks bring them per forward.
        last = lm.model.model.layers[-1]
        assert hasattr(last, "_hf_hook")
        assert next(last.parameters()).device.type == "meta"
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


def test_sharded_evaluation_equals_single_device(
    tiny_model_dir: Path, data: Path, tmp_path: Path
) -> None:
    # Small on purpose: every forward of the sharded model reads the "disk" half from disk.
    harness = HarnessSettings(tasks=("llmft_facts_mc",), num_fewshot=1, limit=4, batch_size=8)
    results = {}
    for name, placement in (
        ("single", {"device": "cpu"}),
        ("sharded", {"device_map": two_shards(tiny_model_dir)}),
    ):
        results[name] = run_evaluation(
            EvaluationRequest(
                base=str(tiny_model_dir), tuned=str(tiny_model_dir), data_dir=str(data),
                output_dir=str(tmp_path / name), max_examples=2, max_new_tokens=8,
                harness=harness, **placement,
            )
        )  # fmt: skip
    single, sharded = results["single"].metrics, results["sharded"].metrics
    assert set(single) == set(sharded)
    for key, value in single.items():
        assert sharded[key] == pytest.approx(value, abs=1e-5), key
    assert "tuned_task_llmft_facts_mc" in sharded
    document = json.loads(Path(results["sharded"].metrics_path).read_text())
    assert "sharded over 2 devices" in document["settings"]["device"]


def _fake_70b(model_dir: Path, tiny_model_dir: Path) -> Path:
    """A "70B" model directory: the tiny model's config and tokenizer, and a safetensors file
    whose header declares 70e9 parameters (its data is absent: only headers may be read)."""
    model_dir.mkdir()
    for f in tiny_model_dir.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, model_dir / f.name)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [70_000_000_000], "data_offsets": [0, 0]}})
    (model_dir / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
    return model_dir


def test_cli_refuses_a_model_too_big_for_the_machine(
    tiny_model_dir: Path, data: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    big = _fake_70b(tmp_path / "llama-70b", tiny_model_dir)
    result = CliRunner().invoke(
        app,
        [
            "evaluate", "--base", str(tiny_model_dir), "--tuned", str(big), "--data", str(data),
            "--output", str(tmp_path / "out"), "--accelerator-type", "NVIDIA_L4",
            "--accelerator-count", "1",
        ],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert "tuned model" in errors[0] and "70.00B parameters" in errors[0]
    assert "use eval_accelerator_type=NVIDIA_L4, eval_accelerator_count=8" in errors[0]
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_document_layout_moves_with_accelerate_hooks() -> None:
    """accelerate moves a layer's kwargs with `send_to_device`, which calls `.to` on objects that
    have one: the packed layout must follow the hidden states onto each GPU's layers."""
    import torch
    from accelerate.utils import send_to_device

    from trainer.attention import DocumentLayout, document_layout

    two_docs = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    regrouped = document_layout(two_docs, multiple=1)
    dense = document_layout(two_docs, multiple=8)  # rounded up to 8 x 8 x 8: the masked fallback
    for layout in (regrouped, dense):
        moved = send_to_device({"document_layout": layout}, "meta")["document_layout"]
        assert isinstance(moved, DocumentLayout)
        assert (moved.documents, moved.max_len) == (layout.documents, layout.max_len)
        for name in ("slots", "mask", "sources"):
            before, after = getattr(layout, name), getattr(moved, name)
            assert (before is None) == (after is None)
            if after is not None:
                assert after.device.type == "meta" and before.device.type == "cpu"
    assert regrouped.slots is not None and dense.mask is not None  # both branches exercised


def test_packed_loss_follows_logits_to_the_head_device(tiny_model_dir: Path, monkeypatch) -> None:
    """With layers spread over GPUs the LM head's logits stay on the last GPU, not on the inputs'
    device: the targets must be moved to the logits (here the head's output is sent to "meta")."""
    import torch

    import trainer.model as trainer_model
    from trainer.attention import document_attention_in
    from trainer.model import CausalLMLoss

    real_head = trainer_model.head_logits
    monkeypatch.setattr(
        trainer_model, "head_logits", lambda lm, hidden: real_head(lm, hidden).to("meta")
    )
    ids = torch.randint(0, 4000, (2, 16), generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([list(range(8)) * 2, list(range(16))])
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[:, 4:8] = True
    mask[:, 12:] = True
    with loaded_model(str(tiny_model_dir), device="cpu") as lm, torch.inference_mode():
        model = lm.model
        with document_attention_in(model) as packed_exact:
            assert packed_exact
            loss = CausalLMLoss(model)
            for on_targets in (True, False):
                loss.last_block_on_targets = on_targets
                losses = loss.token_losses(ids, positions, mask)
                assert losses.device.type == "meta" and losses.shape == (int(mask[:, 1:].sum()),)
