"""Model-family conformance: on packed rows, the trainer's loss is each family's own loss.

For every family a user may bring (tiny random configs built here, CPU, no downloads), every
`attention` setting either reproduces, token by token, the loss of the model's own forward run on
each document alone (transformers' eager attention, the reference implementation, with the
model's own logit post-processing), or is refused with a message naming the feature and the
setting to use. Weights are drawn larger than the families' default init so that attention is
peaked enough for a missed window, sink or scaling to show (checked by `test_features_matter`).
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch

from trainer.config import TrainConfig
from trainer.model import CausalLMLoss, attn_implementation

TOLERANCE = 1e-5
WINDOW = 6
COMMON = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
    initializer_range=0.4, attention_dropout=0.0,
)  # fmt: skip


def family_configs() -> dict[str, Any]:
    import transformers as t

    alternating = ["sliding_attention", "full_attention"]
    return {
        "llama": t.LlamaConfig(**COMMON),
        "mistral": t.MistralConfig(**COMMON, sliding_window=WINDOW),
        "qwen2": t.Qwen2Config(
            **COMMON, use_sliding_window=True, sliding_window=WINDOW, layer_types=alternating
        ),
        "qwen3": t.Qwen3Config(
            **COMMON, use_sliding_window=True, sliding_window=WINDOW, layer_types=alternating
        ),
        "gemma2": t.Gemma2Config(
            **COMMON,
            sliding_window=WINDOW,
            layer_types=alternating,
            query_pre_attn_scalar=8,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
        "gemma3": t.Gemma3TextConfig(
            **COMMON,
            sliding_window=WINDOW,
            layer_types=alternating,
            query_pre_attn_scalar=8,
            final_logit_softcapping=3.0,
        ),
        "phi3": t.Phi3Config(**COMMON, sliding_window=WINDOW, pad_token_id=0),
        "granite": t.GraniteConfig(
            **COMMON,
            logits_scaling=8.0,
            attention_multiplier=0.2,
            embedding_multiplier=2.0,
            residual_multiplier=0.5,
        ),
        "cohere": t.CohereConfig(**COMMON, logit_scale=0.25),
        "gpt_oss": t.GptOssConfig(
            **COMMON,
            sliding_window=WINDOW,
            layer_types=alternating,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
    }


FAMILIES = sorted(family_configs())
REFUSED = {("sdpa", "gemma2"): "soft-capping", ("sdpa", "gpt_oss"): "packed document boundaries",
           ("eager", "gpt_oss"): "packed document boundaries"}  # fmt: skip
"""(setting, family) pairs that cannot be exact: the trainer must refuse them, naming this."""


def packed_rows(
    documents: list[list[int]], seed: int = 0, targets: float = 0.7
) -> dict[str, torch.Tensor]:
    """Random tokens packed as rows of the given document lengths, positions restarting per
    document, and a loss mask with prompt-like gaps (never the first token of a document):
    about `targets` of the positions are targets."""
    generator = torch.Generator().manual_seed(seed)
    length = sum(documents[0])
    assert all(sum(row) == length for row in documents)
    ids = torch.randint(1, COMMON["vocab_size"], (len(documents), length), generator=generator)
    positions = torch.cat(
        [torch.cat([torch.arange(n) for n in row]).unsqueeze(0) for row in documents]
    )
    mask = (torch.rand(ids.shape, generator=generator) < targets).long()
    mask[positions == 0] = 0
    return {"input_ids": ids, "position_ids": positions, "loss_mask": mask}


# Short documents: the trainer regroups tokens per document; long ones: the dense masked fallback.
LAYOUTS = {"short_documents": [[20, 9, 12, 7], [16, 16, 16]], "long_documents": [[48], [40, 8]]}


def reference_token_losses(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each document run alone through the model's own forward; losses of the target tokens."""
    losses = []
    for ids, positions, mask in zip(*batch.values(), strict=True):
        starts = [*torch.nonzero(positions == 0).flatten().tolist(), len(ids)]
        for start, end in itertools.pairwise(starts):
            doc, doc_mask = ids[start:end], mask[start:end]
            logits = model(input_ids=doc.unsqueeze(0), use_cache=False).logits[0, :-1].float()
            token = torch.nn.functional.cross_entropy(logits, doc[1:], reduction="none")
            losses.append(token[doc_mask[1:].bool()])
    return torch.cat(losses)


def build(config: Any, implementation: str, state: dict[str, torch.Tensor] | None = None) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation=implementation, dtype=torch.float32
    )
    if config.model_type == "gpt_oss" and state is None:
        with torch.no_grad():  # sinks start at zero; make them matter
            for name, param in model.named_parameters():
                if name.endswith("sinks"):
                    param.normal_(0.0, 2.0)
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


class References:
    """Per family, built on first use and kept for the module: the model's own eager model, its
    state, and its per-document token losses on each layout."""

    def __init__(self) -> None:
        self.configs = family_configs()
        self.models: dict[str, Any] = {}
        self.losses: dict[tuple[str, str], torch.Tensor] = {}

    def __getitem__(self, family: str) -> tuple[Any, dict[str, torch.Tensor]]:
        if family not in self.models:
            self.models[family] = build(self.configs[family], "eager")
        model = self.models[family]
        return model, model.state_dict()

    def token_losses(self, family: str, layout: str) -> torch.Tensor:
        if (family, layout) not in self.losses:
            with torch.no_grad():
                self.losses[family, layout] = reference_token_losses(
                    self[family][0], packed_rows(LAYOUTS[layout])
                )
        return self.losses[family, layout]


@pytest.fixture(scope="module")
def references() -> References:
    return References()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("setting", ["document", "sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
def test_trainer_loss_equals_model_loss(
    family: str, setting: str, layout: str, references: References
) -> None:
    config = references.configs[family]
    batch = packed_rows(LAYOUTS[layout])
    try:
        implementation = attn_implementation(TrainConfig(attention=setting), config)
    except ValueError as exc:
        assert (setting, family) in REFUSED, f"unexpected refusal: {exc}"
        assert REFUSED[setting, family] in str(exc) and "attention=document" in str(exc)
        return
    assert (setting, family) not in REFUSED, f"attention={setting} must refuse {family}"
    trainer_model = CausalLMLoss(build(config, implementation, references[family][1]))
    expected = references.token_losses(family, layout)
    with torch.no_grad():
        actual = trainer_model.token_losses(**batch)
        total = trainer_model(**batch)
    assert actual.shape == expected.shape == (int(batch["loss_mask"][:, 1:].sum()),)
    torch.testing.assert_close(actual, expected, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(total, expected.sum(), atol=TOLERANCE * len(expected), rtol=0)


NEUTRALIZED = {
    "mistral": {"sliding_window": None},
    "qwen2": {"use_sliding_window": False},
    "gemma2": {"attn_logit_softcapping": None},
    "gemma3": {"final_logit_softcapping": None},
    "phi3": {"sliding_window": None},
    "granite": {"logits_scaling": 1.0},
    "cohere": {"logit_scale": 1.0},
    "gpt_oss": {"sliding_window": 10_000},
}
"""One family feature switched off each: the loss must then differ (the test above can fail)."""


@pytest.mark.parametrize("family", sorted(NEUTRALIZED))
def test_features_matter(family: str, references) -> None:
    config = copy.deepcopy(family_configs()[family])
    for key, value in NEUTRALIZED[family].items():
        setattr(config, key, value)
    if family == "qwen2":
        config.layer_types = ["full_attention"] * config.num_hidden_layers
    expected = references.token_losses(family, "short_documents")
    batch = packed_rows(LAYOUTS["short_documents"])
    with torch.no_grad():
        without = reference_token_losses(build(config, "eager", references[family][1]), batch)
    assert (expected - without).abs().max() > 100 * TOLERANCE


def test_gpt_oss_own_masks_leak_across_documents(references) -> None:
    """Why attention=eager/sdpa are refused for gpt-oss: its own forward on a packed row is not
    its forward on each document (its decoder ignores position_ids when building masks)."""
    reference_model, _ = references["gpt_oss"]
    batch = packed_rows(LAYOUTS["short_documents"])
    with torch.no_grad():
        logits = reference_model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits[:, :-1]
        packed = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), batch["input_ids"][:, 1:], reduction="none"
        )[batch["loss_mask"][:, 1:].bool()]
    expected = references.token_losses("gpt_oss", "short_documents")
    assert (packed - expected).abs().max() > 100 * TOLERANCE


def test_gpt_oss_sinks_matter(references) -> None:
    """Zero sinks are not no sinks: the sink logit takes probability mass from every key."""
    _, state = references["gpt_oss"]
    config = references.configs["gpt_oss"]
    batch = packed_rows(LAYOUTS["short_documents"])
    changed = {k: (v - 50.0 if k.endswith("sinks") else v) for k, v in state.items()}
    expected = references.token_losses("gpt_oss", "short_documents")
    with torch.no_grad():
        no_sinks = reference_token_losses(build(config, "eager", changed), batch)
    assert (expected - no_sinks).abs().max() > 100 * TOLERANCE


def test_multimodal_checkpoint_is_refused_clearly() -> None:
    import transformers as t

    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = t.Gemma3Config(text_config=COMMON, vision_config=vision)
    for setting in ("document", "sdpa", "eager"):
        with pytest.raises(ValueError, match=r"multimodal checkpoint .* text-only"):
            attn_implementation(TrainConfig(attention=setting), config)


@pytest.mark.slow
def test_llmft_train_refuses_an_inexact_attention_before_launching(tmp_path) -> None:
    """`llmft train` exits 2 with one `error:` line naming the feature and the setting to use."""
    import subprocess
    import sys
    from pathlib import Path

    model_dir = tmp_path / "gpt-oss"
    family_configs()["gpt_oss"].save_pretrained(model_dir)
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "train", "--model", str(model_dir),
         "--data", str(tmp_path / "packed"), "--output", str(tmp_path / "run"),
         "--nodes", "1", "--nproc-per-node", "1", "--set", "attention=sdpa"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    # transformers may warn about the tiny config first; the error lists every problem found
    error = out.stderr[out.stderr.index("\nerror: ") + 1 :]
    assert "Traceback" not in out.stderr, out.stderr
    assert "packed document boundaries" in error and "attention=document" in error
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("family", ["gpt_oss", "gemma2", "granite"])
def test_evaluation_loss_equals_model_loss(family: str, references: References) -> None:
    """Evaluation scores packed rows like the trainer, exactly, and leaves the model as it was."""
    from components.evaluation.scoring import score_rows
    from trainer.packed_data.reader import PackedRows

    model, _ = references[family]
    batch = packed_rows(LAYOUTS["short_documents"])
    rows = PackedRows(*(batch[k].numpy() for k in ("input_ids", "loss_mask", "position_ids")))
    result = score_rows(model, rows, device=torch.device("cpu"), batch_size=1)
    expected = references.token_losses(family, "short_documents")
    assert result.target_tokens == len(expected)
    assert result.loss == pytest.approx(expected.double().mean().item(), abs=TOLERANCE)
    assert model.config._attn_implementation == "eager"  # restored for generation


# --- the last block on target positions only (trainer/last_block.py) ------------------------

LAST_BLOCK_FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]
"""Families whose last block runs its post-attention norm and MLP on target positions only."""


def losses_and_gradients(
    model: CausalLMLoss, batch: dict[str, torch.Tensor], on_targets: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[int]]:
    """Per-token losses, parameter gradients, and the row counts the last block's MLP saw."""
    model.last_block_on_targets = on_targets
    model.zero_grad()
    mlp_rows: list[int] = []
    layer = model.causal_lm().get_decoder().layers[-1]
    mlp = getattr(layer, "_checkpoint_wrapped_module", layer).mlp
    hook = mlp.register_forward_pre_hook(lambda m, args: mlp_rows.append(args[0][..., 0].numel()))
    try:
        losses = model.token_losses(**batch)
        losses.sum().backward()
    finally:
        hook.remove()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return losses.detach(), grads, mlp_rows


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpoint_wrapper"])
@pytest.mark.parametrize("family", LAST_BLOCK_FAMILIES)
def test_last_block_on_targets_equals_full_decoder(
    family: str, checkpointed: bool, references: References
) -> None:
    """Same per-token losses and gradients as the full decoder, with the MLP on targets only."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    config = references.configs[family]
    implementation = attn_implementation(TrainConfig(), config)
    model = CausalLMLoss(build(config, implementation, references[family][1])).train()
    if checkpointed:
        layers = model.causal_lm().get_decoder().layers
        for i, layer in enumerate(layers):
            layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
    batch = packed_rows(LAYOUTS["short_documents"], seed=3, targets=0.25)
    targets = int(batch["loss_mask"][:, 1:].sum())
    assert 0 < targets < 0.4 * batch["input_ids"].numel()

    full, full_grads, full_rows = losses_and_gradients(model, batch, on_targets=False)
    fast, fast_grads, fast_rows = losses_and_gradients(model, batch, on_targets=True)

    calls = 2 if checkpointed else 1  # recomputed in backward
    assert full_rows == [batch["input_ids"].numel()] * calls
    assert fast_rows == [targets] * calls
    torch.testing.assert_close(fast, full)
    assert fast_grads.keys() == full_grads.keys()
    for name, grad in full_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - set(LAST_BLOCK_FAMILIES)))
def test_other_families_run_the_full_last_block(family: str, references: References) -> None:
    from trainer import last_block

    config = references.configs[family]
    implementation = attn_implementation(TrainConfig(attention="document"), config)
    model = CausalLMLoss(build(config, implementation, references[family][1])).train()
    assert last_block.last_layer(model.causal_lm().get_decoder()) is None
    batch = packed_rows(LAYOUTS["short_documents"], targets=0.25)
    _, _, rows = losses_and_gradients(model, batch, on_targets=True)
    assert rows == [batch["input_ids"].numel()]


def test_compiled_last_block_runs_the_full_last_block(references: References) -> None:
    """Per-block torch.compile (config.compile) keeps the full path: no per-batch recompiles."""
    from trainer import last_block

    model = build(references.configs["llama"], "sdpa", references["llama"][1])
    decoder = model.get_decoder()
    assert last_block.last_layer(decoder) is not None
    decoder.layers[-1] = torch.compile(decoder.layers[-1])
    assert last_block.last_layer(decoder) is None


# --- evaluation: what generation is fed and where it stops ------------------------------------


def _examples(pairs: list[tuple[str, str]]) -> list:
    from components.evaluation.data import Example

    return [Example([{"role": "user", "content": p}], a, p) for p, a in pairs]


PAIRS = [("What is 864 + 394?", "1258"), ("Name the city", "the capital"), ("Hi", "4 h")]


@pytest.mark.parametrize("template", ["model", "trailing_space"])
def test_inference_prompt_tokens_are_the_trained_prompt_tokens(
    template: str, tiny_model_dir, tmp_path
) -> None:
    """generation.prompt_token_ids == the prompt tokens of the preprocessed training document."""
    from test_beam_transforms import trailing_space_tokenizer
    from transformers import AutoTokenizer

    from beam_preprocess.tokenize import DocumentEncoder, EncoderConfig, TokenizerSpec
    from components.evaluation.generation import prompt_token_ids

    tokenizer_dir = (
        trailing_space_tokenizer(tiny_model_dir, tmp_path / "tok")
        if template == "trailing_space"
        else tiny_model_dir
    )
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    encoder = DocumentEncoder(
        TokenizerSpec.of(tokenizer, str(tokenizer_dir)),
        EncoderConfig(data_kind="chat", seq_len=256, overlong="drop"),
    )
    messages = [
        {"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": a}]}
        for p, a in PAIRS
    ]
    inference = prompt_token_ids(tokenizer, _examples(PAIRS))
    for result, fed in zip(encoder.encode(messages), inference, strict=True):
        ((ids, mask),) = result.docs
        first_target = int(mask.argmax())
        assert ids[:first_target].tolist() == fed
    if template == "trailing_space":  # the case that needs the piecewise encoding
        assert any(r.retokenized for r in encoder.encode(messages))


def test_generation_stops_at_every_generation_config_eos(tiny_model_dir) -> None:
    """A stop token the generation_config names (not the tokenizer's eos) ends the answer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.evaluation.generation import generate_answers, prompt_token_ids, stop_token_ids

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    examples = _examples(PAIRS[:1])
    (prompt,) = prompt_token_ids(tokenizer, examples)
    with torch.no_grad():
        greedy = model.generate(  # as generate_answers calls it (an untrained model has near-ties)
            input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
            do_sample=False, max_new_tokens=12,
            eos_token_id=None, pad_token_id=tokenizer.eos_token_id,
        )[0, len(prompt) :].tolist()  # fmt: skip
    # The first generated token not seen before it stands in for a chat model's end-of-turn id.
    stop_at = next(k for k in range(1, len(greedy)) if greedy[k] not in greedy[:k])
    model.generation_config.eos_token_id = [greedy[stop_at], tokenizer.eos_token_id]
    assert stop_token_ids(model, tokenizer) == [greedy[stop_at], tokenizer.eos_token_id]
    (answer,) = generate_answers(
        model, tokenizer, examples, device=torch.device("cpu"), max_new_tokens=12
    )
    assert answer == tokenizer.decode(greedy[: stop_at + 1], skip_special_tokens=True).strip()
    assert answer != tokenizer.decode(greedy, skip_special_tokens=True).strip()


@pytest.mark.slow
def test_trainer_refuses_an_inexact_attention_with_exit_2(tmp_path) -> None:
    """`python -m trainer` itself (what every rank runs) refuses before touching data or weights."""
    from test_trainer_single import run_trainer

    model_dir = tmp_path / "gemma2"
    family_configs()["gemma2"].save_pretrained(model_dir)
    out = run_trainer(model_dir, tmp_path / "no-data", tmp_path / "run", "--attention", "sdpa")
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "soft-capping" in last and "attention=document" in last


# --- RMSNorm as one autograd Function (trainer/rms_norm.py) -----------------------------------


@pytest.mark.parametrize("family", LAST_BLOCK_FAMILIES)
def test_rms_norm_function_equals_the_class(family: str, references: References) -> None:
    """Installed on every norm of the family: the same losses bit for bit, the same gradients to
    fp32 rounding, also with the norms frozen (LoRA); bf16 keeps the class's forward."""
    from trainer import rms_norm

    config = references.configs[family]
    implementation = attn_implementation(TrainConfig(), config)
    batch = packed_rows(LAYOUTS["short_documents"], seed=5, targets=0.4)
    plain = CausalLMLoss(build(config, implementation, references[family][1])).train()
    fused = CausalLMLoss(build(config, implementation, references[family][1])).train()
    norms = [m for m in fused.modules() if type(m).__name__.endswith("RMSNorm")]
    per_layer = 4 if family == "qwen3" else 2  # + the query and key norms
    assert rms_norm.install(fused) == len(norms) == per_layer * config.num_hidden_layers + 1

    for frozen in (False, True):
        for model in (plain, fused):
            for name, param in model.named_parameters():
                param.requires_grad_(not (frozen and "norm" in name))
        expected, expected_grads, _ = losses_and_gradients(plain, batch, on_targets=True)
        got, got_grads, _ = losses_and_gradients(fused, batch, on_targets=True)
        assert torch.equal(got, expected)
        assert got_grads.keys() == expected_grads.keys()
        for name, grad in expected_grads.items():
            # Sums rounded in another order: within 1e-5 of the gradient's largest element.
            scale = max(grad.abs().max().item(), 1.0)
            torch.testing.assert_close(
                got_grads[name], grad, rtol=0, atol=1e-5 * scale, msg=lambda m, n=name: f"{n}: {m}"
            )

    norm = norms[0].to(torch.bfloat16)
    x = torch.randn(3, 5, norm.weight.shape[0], dtype=torch.bfloat16)
    assert torch.equal(norm(x), type(norm).forward(norm, x))
