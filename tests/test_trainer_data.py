"""Packing correctness, the loss module, data order/resume, and dataset refusal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from packed_fixtures import pack, read_jsonl, tokenize_record, write_packed_dataset

from components.runtime.ports import ReservedPort
from trainer.data import DataPosition, TrainBatches
from trainer.packed_data.format import read_manifest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def packed_dir(tmp_path_factory, tokenizer, sample_data_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("packed_small")
    records = read_jsonl(sample_data_dir / "train.jsonl", 300)
    write_packed_dataset(
        out, tokenizer, {"train": records, "eval": records[:40]}, seq_len=64, rows_per_shard=7
    )
    return out


def _docs(tokenizer, sample_data_dir: Path, n: int):
    return [tokenize_record(tokenizer, r) for r in read_jsonl(sample_data_dir / "train.jsonl", n)]


@torch.no_grad()
def test_no_attention_crosses_document_boundaries(model, tokenizer, sample_data_dir) -> None:
    docs = _docs(tokenizer, sample_data_dir, 3)
    (row,) = pack(docs, seq_len=128, pad_id=tokenizer.pad_token_id)
    ids = torch.tensor([row["input_ids"]])
    pos = torch.tensor([row["position_ids"]])
    packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
    start = 0
    for doc_ids, _ in docs:
        alone = model(input_ids=torch.tensor([doc_ids]), use_cache=False).logits[0]
        torch.testing.assert_close(
            packed[start : start + len(doc_ids)], alone, atol=2e-5, rtol=1e-4
        )
        start += len(doc_ids)
    # Control: the check has teeth. With an attention mask, transformers attends across documents.
    leaky = model(
        input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids), use_cache=False
    ).logits[0]
    last = len(docs[0][0]) + len(docs[1][0])
    assert not torch.allclose(
        leaky[last : last + len(docs[2][0])], packed[last : last + len(docs[2][0])], atol=1e-3
    )


@torch.no_grad()
def test_loss_module_counts_only_targets_per_document(model, tokenizer, sample_data_dir) -> None:
    from trainer.model import CausalLMLoss

    docs = _docs(tokenizer, sample_data_dir, 4)
    (row,) = pack(docs, seq_len=128, pad_id=tokenizer.pad_token_id)
    loss_module = CausalLMLoss(model)
    packed = loss_module(
        torch.tensor([row["input_ids"]]),
        torch.tensor([row["position_ids"]]),
        torch.tensor([row["loss_mask"]]),
    )
    expected = 0.0
    for ids, mask in docs:
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        targets = torch.tensor(mask[1:]).bool()
        expected += torch.nn.functional.cross_entropy(
            logits[:-1][targets], torch.tensor(ids[1:])[targets], reduction="sum"
        ).item()
    assert packed.item() == pytest.approx(expected, rel=1e-5)
    assert sum(row["loss_mask"]) == sum(sum(m) for _, m in docs)  # prompt tokens: no targets


def _batches(packed_dir: Path, rank: int, world: int, **kw) -> TrainBatches:
    return TrainBatches(
        str(packed_dir), read_manifest(str(packed_dir)), rank=rank, world_size=world,
        micro_batch_size=kw.get("mbs", 2), grad_accum_steps=kw.get("accum", 2), seed=3,
        shuffle=True,
    )  # fmt: skip


def _row_keys(micro) -> list[tuple[int, ...]]:
    return [tuple(r.tolist()) for mb in micro for r in mb.input_ids]


def test_ranks_split_each_step_and_resume_continues_exactly(packed_dir: Path) -> None:
    world = 2
    ranks = [_batches(packed_dir, r, world) for r in range(world)]
    n_rows, per_epoch = ranks[0].rows, ranks[0].steps_per_epoch
    assert per_epoch == n_rows // 8
    iters = [b.iterate(DataPosition()) for b in ranks]
    seen_epoch0: list[tuple[int, ...]] = []
    history = []
    for _ in range(per_epoch + 2):  # crosses into epoch 1
        steps = [next(it) for it in iters]
        keys = [_row_keys(micro) for micro, _ in steps]
        assert not set(keys[0]) & set(keys[1])  # disjoint across ranks
        history.append((keys, steps[0][1]))
        if steps[0][1].epoch == 0 or steps[0][1].offset == 0:
            seen_epoch0 += keys[0] + keys[1]
    assert history[per_epoch - 1][1] == DataPosition(0, per_epoch * 8)
    assert history[per_epoch][1] == DataPosition(1, 8)
    assert len(set(seen_epoch0)) == per_epoch * 8  # no row twice within an epoch
    # Resuming from a stored position yields exactly the rows an uninterrupted run reads next.
    resume_at = history[2][1]
    resumed = [_batches(packed_dir, r, world).iterate(resume_at) for r in range(world)]
    for keys, _ in history[3:]:
        assert [_row_keys(next(it)[0]) for it in resumed] == keys


def test_loss_mask_never_targets_a_document_start(packed_dir: Path) -> None:
    micro, _ = next(_batches(packed_dir, 0, 1).iterate(DataPosition()))
    for mb in micro:
        assert not (mb.loss_mask.bool() & (mb.position_ids == 0)).any()
        assert set(np.unique(mb.labels()[mb.loss_mask == 0]).tolist()) == {-100}


def _run_single(tmp_path: Path, model: Path, data: Path, *extra: str):
    port = ReservedPort()  # held for the run: the trainer's store takes it over
    env = {
        **os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port.port), "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    with port:
        return subprocess.run(
        [sys.executable, "-m", "trainer", "--model", str(model), "--data", str(data),
         "--output", str(tmp_path / "out"), "--max-steps", "2", *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_dataset_that_does_not_match_is_refused(
    tmp_path: Path, tiny_model_dir: Path, packed_dir: Path
) -> None:
    foreign = tmp_path / "foreign"
    shutil.copytree(packed_dir, foreign)
    manifest = json.loads((foreign / "manifest.json").read_text())
    manifest["tokenizer"]["fingerprint"] = "0" * 64  # packed with some other vocabulary
    (foreign / "manifest.json").write_text(json.dumps(manifest))
    proc = _run_single(tmp_path, tiny_model_dir, foreign, "--seq-len", "128")
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "seq_len=64 but seq_len=128" in line and "tokenizer mismatch on fingerprint" in line
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_remote_model_is_downloaded_once_into_the_node_cache(tmp_path, monkeypatch) -> None:
    import fsspec

    from trainer.model import resolve_model_dir

    monkeypatch.setenv("LLMFT_CACHE_DIR", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    fs.pipe({"/bucket/m/config.json": b"{}", "/bucket/m/sub/tokenizer.json": b"[]"})
    try:
        local = Path(resolve_model_dir("memory://bucket/m", local_rank=0))
        assert (local / "config.json").read_bytes() == b"{}"
        assert (local / "sub" / "tokenizer.json").read_bytes() == b"[]"
        fs.rm("/bucket/m", recursive=True)  # a second call must not download again
        assert Path(resolve_model_dir("memory://bucket/m", local_rank=0)) == local
    finally:
        if fs.exists("/bucket"):
            fs.rm("/bucket", recursive=True)
    with pytest.raises(ValueError, match="not a directory"):
        resolve_model_dir(str(tmp_path / "missing" / "model"), local_rank=0)


@pytest.mark.parametrize("layout", ["per_document", "one_per_row", "masked"])
def test_document_attention_matches_masked_sdpa(
    tiny_model_dir: Path, tokenizer, sample_data_dir: Path, layout: str
) -> None:
    from transformers import AutoModelForCausalLM

    from trainer import attention
    from trainer.model import CausalLMLoss

    attention.register()
    docs = _docs(tokenizer, sample_data_dir, 12)
    ids = [t for d, _ in docs for t in d][:100]
    if layout == "one_per_row":  # one document fills the row: plain causal attention
        docs = [(ids, [0] * 10 + [1] * 90)]
    elif layout == "masked":  # a long document and two short ones: the dense masked fallback
        docs = [(ids[:80], [0] + [1] * 79), (ids[80:88], [0] + [1] * 7), (ids[88:], [0] + [1] * 11)]
    # Rows of documents only (the last one cut off), as a best-fit packer leaves them.
    (row,) = pack(docs, seq_len=10_000, pad_id=tokenizer.pad_token_id)
    keys = ("input_ids", "position_ids", "loss_mask")
    batch = [torch.tensor([row[k][:96]]) for k in keys]
    found = attention.document_layout(batch[1])
    assert (found.slots is not None, found.mask is not None) == {
        "per_document": (True, False),
        "one_per_row": (False, False),
        "masked": (False, True),
    }[layout]
    results = []
    for impl in ("sdpa", attention.NAME):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=impl)
        loss = CausalLMLoss(model)(*batch)
        loss.backward()
        results.append((loss.item(), model.model.layers[1].self_attn.k_proj.weight.grad))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-5, rtol=1e-4)


def test_document_layout_gather_equals_a_zero_padded_layout_bit_for_bit() -> None:
    """The layout reads each slot's token (padding reads a real one) instead of copying tokens
    into zeros: causal attention never lets a real query see the padding after it, so outputs
    and gradients are the zero-padded layout's exactly, at exact and rounded-up sizes."""
    import torch

    from trainer import attention

    torch.manual_seed(0)
    lengths = [
        [3, 5, 2, 7, 1, 4, 6, 3, 5, 2, 7, 4, 6, 3, 5, 1],
        [5, 5, 4, 3, 6, 2, 7, 5, 4, 6, 3, 5, 4, 5],
    ]
    positions = torch.tensor([[p for n in row for p in range(n)] for row in lengths])
    q0, k0, v0 = (torch.randn(2, h, 64, 8) for h in (4, 2, 2))

    def zero_padded(x: torch.Tensor, layout: attention.DocumentLayout) -> torch.Tensor:
        b, h, length, d = x.shape
        tokens = x.transpose(1, 2).reshape(b * length, h, d)
        out = tokens.new_zeros(layout.documents * layout.max_len, h, d)
        out = out.index_copy(0, layout.slots, tokens)
        return out.view(layout.documents, layout.max_len, h, d).transpose(1, 2)

    for multiple in (1, 8):
        layout = attention.document_layout(positions, multiple=multiple)
        assert layout.slots is not None
        results = []
        for to_documents in (attention._to_documents, zero_padded):
            q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
            saved = attention._to_documents
            attention._to_documents = to_documents
            try:
                out, _ = attention.document_attention(
                    torch.nn.Module(), q, k, v, None, document_layout=layout
                )
            finally:
                attention._to_documents = saved
            out.backward(torch.randn_like(out, generator=torch.Generator().manual_seed(1)))
            results.append([out.detach(), q.grad, k.grad, v.grad])
        for ours, reference in zip(*results, strict=True):
            assert torch.equal(ours, reference)


def test_metrics_to_an_object_store_are_staged_and_uploaded() -> None:
    import fsspec

    from trainer.metrics import MetricsWriter

    fs = fsspec.filesystem("memory")
    fs.pipe("/run/metrics.jsonl", b'{"step": 1, "loss": 3.0}\n')  # an earlier attempt's lines
    try:
        writer = MetricsWriter("memory://run", enabled=True, tensorboard=True)
        writer.write(2, {"loss": 2.5, "mfu": None})
        lines = fs.cat("/run/metrics.jsonl").decode().splitlines()
        assert [json.loads(x)["step"] for x in lines] == [1, 2]
        writer.close()
        assert any("tfevents" in p for p in fs.find("/run/tensorboard"))
    finally:
        fs.rm("/run", recursive=True)
