"""The exported model directory as servers load it, and served for real on CPU (issue 30).

The trainer runs (one process, LoRA, a few steps) and exports; the export is then loaded the way
vLLM and `transformers serve` load a model directory (AutoConfig / AutoTokenizer with
trust_remote_code=False, the chat template applied, the generation config read), and the deploy
step's local path starts `transformers serve` on it, asks the smoke prompt and stops it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packed_fixtures import read_jsonl, write_packed_dataset
from test_trainer_single import run_trainer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def lora_export(tmp_path_factory, tiny_model_dir: Path, sample_data_dir: Path) -> Path:
    from transformers import AutoTokenizer

    packed = tmp_path_factory.mktemp("packed_serving")
    records = read_jsonl(sample_data_dir / "train.jsonl", 64)
    write_packed_dataset(
        packed,
        AutoTokenizer.from_pretrained(tiny_model_dir),
        {"train": records, "eval": records[:8]},
        seq_len=128,
    )
    out = tmp_path_factory.mktemp("serving_run") / "run"
    proc = run_trainer(
        tiny_model_dir, packed, out, "--max-steps", "2", "--lora-rank", "8",
        "--lora-target-modules", "q_proj,v_proj", "--warmup-steps", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "model"


def test_export_loads_as_the_servers_load_it(lora_export: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from components.steps.register import lora_rank

    files = {p.name for p in lora_export.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= files, files
    assert any(name.endswith(".safetensors") for name in files), files
    config = AutoConfig.from_pretrained(lora_export, trust_remote_code=False)
    assert config.model_type == "llama"
    tokenizer = AutoTokenizer.from_pretrained(lora_export, trust_remote_code=False)
    assert tokenizer.chat_template, "the export must carry the chat template servers apply"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "what is 2 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    assert "what is 2 + 2?" in text
    GenerationConfig.from_pretrained(lora_export)
    # The adapter that lora_serving=adapter serves (vLLM --enable-lora --max-lora-rank 8).
    adapter = json.loads((lora_export / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and lora_rank(str(lora_export)) == 8


def test_deploy_step_serves_the_export_locally(lora_export: Path) -> None:
    """The local deploy: a real OpenAI-compatible server, one chat completion, server stopped."""

    from components.params.step_params import request_of
    from components.steps.deploy import COMPONENT as DEPLOY_STEP
    from components.steps.deploy import run

    request = request_of(
        DEPLOY_STEP,
        model_uri=str(lora_export),
        vertex_model=None,
        run_id="local-serve",
        project="",
        region="us-central1",
        serving_preset="vertex-vllm",
        deploy_endpoint="local",
        deploy_machine_type="",
        deploy_accelerator_type="",
        deploy_accelerator_count=0,
        deploy_spot=False,
        deploy_traffic_percent=100,
        encryption_key="",
        local=True,
    )
    url, answer = run(request)
    assert url.endswith("/v1/chat/completions") and isinstance(answer, str)
    port = int(url.split(":")[2].split("/")[0])
    import socket

    with socket.socket() as s:  # the server is gone: its port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
