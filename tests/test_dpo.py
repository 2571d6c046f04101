"""DPO: preference pairs packed into rows (beam_preprocess/pairs.py) and the loss on them
(trainer/preference.py, `CausalLMLoss` with `pair_ids`), checked against TRL's DPOTrainer on the
same tiny model and pairs, against the paper's formula on each pair unpacked, and end to end
through `python -m trainer --objective dpo`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from packed_fixtures import read_jsonl

from beam_preprocess.pairs import PairError, normalize, pack_pairs, row_of, tokenize_pair
from beam_preprocess.preference import write_dataset
from components.params.run_checks import run_errors
from trainer.packed_data.format import PAIR_COLUMN, read_manifest
from trainer.packed_data.reader import read_split

BETA = 0.1
LORA_TARGETS = ["q_proj", "v_proj"]


def preference_records(sample_data_dir: Path, n: int) -> list[dict[str, Any]]:
    """Conversational pairs (TRL's format): the real response is chosen, another one rejected."""
    recs = read_jsonl(sample_data_dir / "train.jsonl", n)
    return [
        {
            "prompt": [{"role": "user", "content": r["prompt"]}],
            "chosen": [{"role": "assistant", "content": r["response"]}],
            "rejected": [{"role": "assistant", "content": recs[(i + 3) % n]["response"]}],
        }
        for i, r in enumerate(recs)
    ]


def other_shapes(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A single-turn conversational pair as the other two accepted shapes: (text, chat pair)."""
    text = {key: record[key][0]["content"] for key in ("prompt", "chosen", "rejected")}
    chat = {key: record["prompt"] + record[key] for key in ("chosen", "rejected")}
    return text, chat


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def lora_model(model_dir: Path, attn_implementation: str | None = None) -> Any:
    """The tiny model with LoRA adapters whose B matrices are random (not the zero init), so the
    policy differs from the reference and the loss is not log 2."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kwargs)
    torch.manual_seed(0)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    return model


def packed_batch(tokenizer: Any, records: list[dict[str, Any]], seq_len: int) -> dict[str, Any]:
    pairs = [tokenize_pair(tokenizer, r) for r in records]
    rows = [row_of(p, seq_len, tokenizer.pad_token_id) for p in pack_pairs(pairs, seq_len)]
    return {k: torch.tensor([r[k] for r in rows]) for k in rows[0]}


def packed_stats(model_dir: Path, tokenizer: Any, records: list[dict[str, Any]]) -> torch.Tensor:
    """[loss sum, margin sum, correct pairs] from the trainer's loss module on packed rows."""
    from transformers import AutoConfig

    from trainer import attention
    from trainer.model import CausalLMLoss

    implementation = attention.implementation("document", AutoConfig.from_pretrained(model_dir))
    root = CausalLMLoss(lora_model(model_dir, implementation))
    root.dpo_beta = BETA
    batch = packed_batch(tokenizer, records, seq_len=512)
    with torch.no_grad():
        return root(
            batch["input_ids"], batch["position_ids"], batch["loss_mask"], batch[PAIR_COLUMN]
        )


def test_pairs_pack_whole_with_document_ids(tokenizer: Any, sample_data_dir: Path) -> None:
    records = preference_records(sample_data_dir, 12)
    pairs = [tokenize_pair(tokenizer, r) for r in records]
    rows = pack_pairs(pairs, 256)
    assert sorted(id(p) for row in rows for p in row) == sorted(id(p) for p in pairs)
    assert all(sum(len(p) for p in row) <= 256 for row in rows)
    row = row_of(rows[0], 256, tokenizer.pad_token_id)
    ids = np.array(row[PAIR_COLUMN])
    assert len(ids) == 256 and ids.max() == 2 * len(rows[0])
    for k, pair in enumerate(rows[0]):
        chosen, rejected = np.flatnonzero(ids == 2 * k + 1), np.flatnonzero(ids == 2 * k + 2)
        assert [row["input_ids"][i] for i in chosen] == pair.chosen[0]
        assert [row["input_ids"][i] for i in rejected] == pair.rejected[0]
        assert row["position_ids"][chosen[0]] == 0 and row["position_ids"][rejected[0]] == 0
        assert row["loss_mask"][chosen[0]] == 0  # the first token of a document is no target
    # The string form and the chat-pair form give the same tokens as the conversational one.
    first = records[0]
    text, chat = other_shapes(first)
    assert tokenize_pair(tokenizer, text) == pairs[0] == tokenize_pair(tokenizer, chat)
    with pytest.raises(PairError, match="differ before"):
        normalize(
            {
                "chosen": chat["chosen"],
                "rejected": [{"role": "user", "content": "x"}, *first["rejected"]],
            }
        )
    # A conversational completion of several messages is refused, not cut to its first one.
    longer = [*first["chosen"], {"role": "user", "content": "more?"}, *first["rejected"]]
    with pytest.raises(PairError, match="one assistant message") as refused:
        normalize({**first, "chosen": longer})
    assert refused.value.reason == "pair_shape"


def test_a_top_level_system_prompt_opens_both_sides_as_for_instruction_records(
    sample_data_dir: Path,
) -> None:
    """As instruction records' `system` field does (beam_preprocess.shapes), in every pair shape;
    a history with its own system turn keeps it; the field counts as read, not unused."""
    from beam_preprocess import shapes

    first = preference_records(sample_data_dir, 1)[0]
    system = {"role": "system", "content": "Answer briefly."}
    text, chat = other_shapes(first)
    for record in (text, first, chat):
        history, chosen, rejected = normalize({**record, "system": "Answer briefly."})
        assert history == [system, *first["prompt"]]
        assert (chosen, rejected) == (text["chosen"], text["rejected"])
        assert normalize({**record, "system": "  "})[0] == first["prompt"]  # blank: none
    own = {**first, "prompt": [{"role": "system", "content": "Be kind."}, *first["prompt"]]}
    assert normalize({**own, "system": "Answer briefly."})[0] == own["prompt"]
    with pytest.raises(PairError, match="'system' is list, not text") as refused:
        normalize({**first, "system": ["Answer briefly."]})
    assert refused.value.reason == "invalid_field_type"
    shape = shapes.Shape.of("preference", "auto")
    example, unused = shapes.example_of({**text, "system": "Answer briefly.", "id": 7}, shape)
    assert example["messages"][0] == system and unused == ["id"]


def test_preference_dataset_round_trips_and_old_manifests_load(
    tmp_path: Path, tokenizer: Any, sample_data_dir: Path
) -> None:
    records = preference_records(sample_data_dir, 40)
    too_long = {**records[0], "chosen": [{"role": "assistant", "content": "word " * 400}]}
    manifest = write_dataset(
        tmp_path, tokenizer, {"train": [*records[:30], too_long], "eval": records[30:]}, 256
    )
    assert manifest.data_kind == "preference" and manifest.minor_version >= 1
    assert manifest.stats["filtered_by_reason"] == {"too_long_tokens": 1}
    rows = read_split(str(tmp_path), read_manifest(str(tmp_path)), "train")
    assert rows.pair_ids is not None and int((rows.pair_ids.max(axis=1) // 2).sum()) == 30
    # A manifest written before minor versions existed still loads, as minor 0.
    old = json.loads((tmp_path / "manifest.json").read_text())
    del old["minor_version"]
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    assert read_manifest(str(tmp_path)).minor_version == 0


def unpacked_reference(model_dir: Path, tokenizer: Any, records: list[dict[str, Any]]) -> Any:
    """The paper's formula (Rafailov et al. 2023, eq. 7) on each pair alone, with the model's own
    forward (no packing, no trainer code): log-probs summed over each response's tokens."""
    model = lora_model(model_dir, "eager").eval()

    def response_logp(ids: list[int], mask: list[int]) -> float:
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
        logps = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        return float((logps * torch.tensor(mask[1:])).sum())

    losses, margins = [], []
    with torch.no_grad():
        for record in records:
            pair = tokenize_pair(tokenizer, record)
            policy = [response_logp(*pair.chosen), response_logp(*pair.rejected)]
            with model.disable_adapter():
                reference = [response_logp(*pair.chosen), response_logp(*pair.rejected)]
            margin = BETA * ((policy[0] - reference[0]) - (policy[1] - reference[1]))
            losses.append(-math.log(1 / (1 + math.exp(-margin))))
            margins.append(margin)
    return np.array(losses), np.array(margins)


def test_packed_dpo_equals_the_formula_on_unpacked_pairs(
    tiny_model_dir: Path, tokenizer: Any, sample_data_dir: Path
) -> None:
    records = preference_records(sample_data_dir, 10)
    losses, margins = unpacked_reference(tiny_model_dir, tokenizer, records)
    assert abs(losses.mean() - math.log(2)) > 1e-3  # the policy differs from the reference
    stats = packed_stats(tiny_model_dir, tokenizer, records)
    assert float(stats[0]) == pytest.approx(losses.sum(), abs=1e-4)
    assert float(stats[1]) == pytest.approx(margins.sum(), abs=1e-4)
    assert int(stats[2]) == int((margins > 0).sum())


@pytest.mark.integration  # TRL's DPOTrainer: a third-party training loop, kept out of the 2-minute unit loop
def test_dpo_loss_and_margins_match_trls_dpo_trainer(
    tmp_path: Path, tiny_model_dir: Path, tokenizer: Any, sample_data_dir: Path
) -> None:
    """TRL's DPOTrainer (sigmoid loss) on the same pairs: its policy is the LoRA model merged,
    its reference the base model (given explicitly: handed a PeftModel, TRL would take the
    initial adapter as reference; ours disables the adapters, which is the base)."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    records = preference_records(sample_data_dir, 8)
    policy = lora_model(tiny_model_dir).merge_and_unload()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    args = trl.DPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, report_to=[], use_cpu=True,
        beta=BETA, loss_type=["sigmoid"], max_length=None, bf16=False,  # TRL defaults to bf16
    )  # fmt: skip
    trainer = trl.DPOTrainer(
        model=policy,
        ref_model=reference,
        args=args,
        train_dataset=Dataset.from_list(records),
        processing_class=tokenizer,
    )
    batches = iter(trainer.get_train_dataloader())
    policy.eval()  # no dropout either side
    for step in range(2):  # TRL's sampler order: take the pairs it batched
        batch = next(batches)
        with torch.no_grad():
            trl_loss = float(trainer.compute_loss(policy, batch))
        logged = trainer._metrics["eval"]  # TRL files metrics by mode; the model is in eval
        trl_margin, trl_accuracy = logged["rewards/margins"][-1], logged["rewards/accuracies"][-1]
        ids = batch["input_ids"].tolist()
        chosen = [_strip(ids[i], batch["attention_mask"][i]) for i in range(len(ids) // 2)]
        ours = packed_stats(
            tiny_model_dir, tokenizer, [_record_of(records, tokenizer, c) for c in chosen]
        )
        pairs = len(chosen)
        assert float(ours[0]) / pairs == pytest.approx(trl_loss, abs=1e-4), step
        assert float(ours[1]) / pairs == pytest.approx(trl_margin, abs=1e-4), step
        assert float(ours[2]) / pairs == pytest.approx(trl_accuracy, abs=1e-6), step


def _strip(ids: list[int], attention_mask: torch.Tensor) -> list[int]:
    return [i for i, keep in zip(ids, attention_mask.tolist(), strict=True) if keep]


def _record_of(records: list[dict[str, Any]], tokenizer: Any, chosen_ids: list[int]) -> dict:
    """The record whose chosen side tokenizes to `chosen_ids` (TRL's batch order)."""
    for record in records:
        if tokenize_pair(tokenizer, record).chosen[0] == chosen_ids:
            return record
    raise AssertionError("TRL batched a pair that is not among the records")


@pytest.mark.integration
@pytest.mark.slow
def test_trainer_runs_dpo_on_a_qlora_base(
    tmp_path: Path, tiny_model_dir: Path, tokenizer: Any, sample_data_dir: Path
) -> None:
    """`python -m trainer --objective dpo` on a packed preference dataset, NF4 base: the first
    step's loss is log 2 (zero-initialized adapters: policy = reference), rewards move after,
    the eval split reports the win rate of the chosen responses, and `run_evaluation` of the
    export (its DPO reference the base through the same NF4 round trip) reproduces it."""
    from test_trainer_single import run_trainer

    records = preference_records(sample_data_dir, 60)
    data = tmp_path / "pairs"
    write_dataset(data, tokenizer, {"train": records[:48], "eval": records[48:]}, 256)
    out = tmp_path / "run"
    proc = run_trainer(
        tiny_model_dir, data, out, "--objective", "dpo", "--lora-rank", "8",
        "--quantize-base", "nf4", "--lr", "1e-3", "--max-steps", "3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert steps[0]["reward_margin"] == 0.0
    assert any(r["reward_margin"] != 0.0 for r in steps[1:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["objective"] == "dpo" and 0.0 <= summary["eval_win_rate"] <= 1.0
    assert "eval_reward_margin" in summary
    assert summary["quantize_base"] == "nf4" and summary["compute_dtype"] == "fp32"
    # The evaluation of the exported model on the same held-out pairs, its reference the base
    # through the trainer's NF4 round trip: the trainer's numbers (the merged export is the
    # trained model to float rounding). The full-precision base as reference gives others.
    from components.evaluation.evaluate import run_evaluation
    from components.evaluation.request import EvaluationRequest

    def evaluation(name: str, **reference: str) -> dict[str, float]:
        request = EvaluationRequest(
            base=str(tiny_model_dir), tuned=summary["model_dir"], data_dir=str(data),
            output_dir=str(tmp_path / name), objective="dpo", dpo_beta=BETA, device="cpu",
            max_examples=0, **reference,
        )  # fmt: skip
        return run_evaluation(request).metrics

    m = evaluation(
        "eval", quantize_base=summary["quantize_base"], compute_dtype=summary["compute_dtype"]
    )
    assert m["preference_pairs"] == len(records[48:])
    assert m["tuned_win_rate"] == summary["eval_win_rate"]
    assert m["tuned_reward_margin"] == pytest.approx(summary["eval_reward_margin"], abs=1e-6)
    assert m["tuned_eval_loss"] == pytest.approx(summary["eval_loss"], abs=1e-6)
    # The base's DPO numbers are the reference's own (the trainer's step 0); its token loss is
    # the full-precision base's.
    assert m["base_eval_loss"] == pytest.approx(math.log(2), abs=1e-12)
    assert m["base_win_rate"] == 0.0 and m["base_reward_margin"] == 0.0
    full = evaluation("eval_full_precision_reference")
    assert full["base_response_nll"] == m["base_response_nll"]
    assert abs(full["tuned_reward_margin"] - summary["eval_reward_margin"]) > 1e-4
    # An instruction dataset is refused for DPO, before training (exit 2, one error line).
    sft = tmp_path / "sft_run"
    proc = run_trainer(tiny_model_dir, data, sft, "--lora-rank", "8", "--max-steps", "1")
    assert proc.returncode == 2 and "set objective=dpo for preference pairs" in proc.stderr


def test_evaluation_win_rate_is_the_trainers_reward_accuracy_against_the_base(
    tmp_path: Path,
    tiny_model_dir: Path,
    tokenizer: Any,
    sample_data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`run_evaluation(objective="dpo")` on a preference eval split: the tuned model (the LoRA
    model merged) scored against the base as reference gives the trainer's own DPO numbers
    (CausalLMLoss with `pair_ids`: reference = adapters off = the base), also on the scoring
    path for models the document attention does not apply to."""
    from components.evaluation.evaluate import run_evaluation
    from components.evaluation.request import EvaluationRequest

    records = preference_records(sample_data_dir, 24)
    data = tmp_path / "pairs"
    write_dataset(data, tokenizer, {"train": records[:12], "eval": records[12:]}, 512)
    tuned = tmp_path / "tuned"
    lora_model(tiny_model_dir).merge_and_unload().save_pretrained(tuned)
    tokenizer.save_pretrained(tuned)
    result = run_evaluation(
        EvaluationRequest(
            base=str(tiny_model_dir), tuned=str(tuned), data_dir=str(data),
            output_dir=str(tmp_path / "eval"), objective="dpo", dpo_beta=BETA, device="cpu",
        )
    )  # fmt: skip
    m = result.metrics
    stats = packed_stats(tiny_model_dir, tokenizer, records[12:])
    pairs = len(records[12:])
    assert m["preference_pairs"] == pairs
    assert m["tuned_eval_loss"] == pytest.approx(float(stats[0]) / pairs, abs=1e-4)
    assert m["tuned_reward_margin"] == pytest.approx(float(stats[1]) / pairs, abs=1e-4)
    assert m["tuned_win_rate"] == float(stats[2]) / pairs
    # The base against itself: policy = reference, loss log 2, no margin, no pair won.
    assert m["base_eval_loss"] == pytest.approx(math.log(2), abs=1e-12)
    assert m["base_win_rate"] == 0.0 and m["base_reward_margin"] == 0.0
    assert "tuned_perplexity" not in m and m["tuned_response_nll"] > 0
    report = Path(result.report_path).read_text()
    assert "Win rate on held-out pairs" in report and "held-out preference pairs" in report
    from trainer import attention

    monkeypatch.setattr(attention, "support_errors", lambda *args: ["not this family"])
    plain = run_evaluation(
        EvaluationRequest(
            base=str(tiny_model_dir), tuned=str(tuned), data_dir=str(data),
            output_dir=str(tmp_path / "plain"), objective="dpo", dpo_beta=BETA, device="cpu",
        )
    ).metrics  # fmt: skip
    for key in ("tuned_eval_loss", "tuned_reward_margin", "tuned_win_rate", "base_eval_loss"):
        assert plain[key] == pytest.approx(m[key], abs=1e-4), key
    monkeypatch.undo()
    # An sft evaluation of pairs, or a dpo one of instruction data, is refused before loading.
    with pytest.raises(ValueError, match="evaluate a DPO model with objective=dpo"):
        run_evaluation(
            EvaluationRequest(
                base=str(tiny_model_dir), tuned=str(tuned), data_dir=str(data),
                output_dir=str(tmp_path / "eval2"),
            )
        )  # fmt: skip


def test_run_parameters_pair_objective_dpo_with_preference_data() -> None:
    from components.params.run_params import RunParams

    def errors(**values: Any) -> list[str]:
        return run_errors(RunParams(train_data_uri="pairs.jsonl", base_model="m", **values))

    lora = {"trainer_overrides": {"lora_rank": 8}}
    assert errors(objective="dpo", data_kind="preference", **lora) == []
    assert any("set data_kind=preference" in e for e in errors(objective="dpo", **lora))
    assert any(
        "set objective=dpo" in e for e in errors(data_kind="preference", **lora)
    )  # the trainer would refuse sft on pairs, after preprocessing
    (no_lora,) = errors(objective="dpo", data_kind="preference")
    assert "lora_rank" in no_lora  # DPO's reference is the base with the adapters off
    assert any(
        "record format 'chat'" in e
        for e in errors(objective="dpo", data_kind="preference", record_format="chat", **lora)
    )
    assert any(
        e.startswith("prompt_field: not applicable to data kind preference")
        for e in errors(objective="dpo", data_kind="preference", prompt_field="question", **lora)
    )


def test_pack_pairs_is_first_fit_decreasing() -> None:
    """The tree search of `pack_pairs` puts every pair where a plain first-fit scan would."""
    import random

    from beam_preprocess.pairs import Pair

    rng = random.Random(0)
    sizes = [(rng.randint(1, 300), rng.randint(1, 300)) for _ in range(2000)]
    pairs = [Pair(([0] * a, [0] * a), ([0] * b, [0] * b)) for a, b in sizes]
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(pairs)), key=lambda i: (-len(pairs[i]), i)):
        slot = next((j for j, room in enumerate(free) if room >= len(pairs[i])), None)
        if slot is None:
            rows.append([])
            free.append(1024)
            slot = len(rows) - 1
        rows[slot].append(i)
        free[slot] -= len(pairs[i])
    index = {id(p): i for i, p in enumerate(pairs)}
    packed = [[index[id(p)] for p in row] for row in pack_pairs(pairs, 1024)]
    assert packed == rows and len(rows) > 100
