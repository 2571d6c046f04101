"""GRPO: the loss, its gradient and the advantages against TRL 1.16's GRPOTrainer (its own
`_compute_loss` method and its own advantage code, run on the same fixed log-probabilities and
rewards), and the rewards (built-ins, weights, a user's module, the errors naming function and
record).

Run: PYTHONPATH=$PWD pytest -q tests/test_grpo.py
"""

from __future__ import annotations

import inspect
import textwrap
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trainer.grpo import reward_module
from trainer.grpo.loss import LOSS_TYPES, GrpoLoss, group_advantages, grpo_stats
from trainer.grpo.rewards import Reward, RewardError, normalize, parse_rewards, score, total


def trl_grpo() -> tuple[Any, Any]:
    """TRL's GRPOTrainer and its nanstd, imported when a test first needs them: importing TRL
    costs about 10 s of CPU on this 2-core machine, so under `pytest -n 2` only the worker that
    runs the TRL files (one xdist group: tests/conftest.py) pays it, not both at collection."""
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import nanstd

    return GRPOTrainer, nanstd


G = 4  # completions per prompt
PROMPTS = 3
T = 7  # completion tokens (padded)


def fixed_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Completions of unequal length (mask), log-probs of the current, old and reference policy."""
    gen = torch.Generator().manual_seed(seed)
    n = G * PROMPTS
    logps = -torch.rand(n, T, generator=gen, dtype=torch.float64) * 3
    lengths = torch.randint(2, T + 1, (n,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return {
        "logps": logps,
        # Old and reference differ from the current policy by up to +-0.5 nats: some ratios clip.
        "old": logps + (torch.rand(n, T, generator=gen, dtype=torch.float64) - 0.5),
        "ref": logps + (torch.rand(n, T, generator=gen, dtype=torch.float64) - 0.5) * 0.6,
        "mask": mask,
        "rewards": torch.tensor(
            [1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], dtype=torch.float64
        ),
    }


def trl_loss(batch: dict[str, torch.Tensor], advantages: torch.Tensor, s: GrpoLoss):
    """TRL's GRPOTrainer._compute_loss on these log-probs (a leaf tensor): (loss, its gradient)."""
    logps = batch["logps"].clone().requires_grad_(True)
    loss = trl_compute_loss(logps, batch, advantages, s)
    loss.backward()
    return loss.detach(), logps.grad


def trl_compute_loss(
    logps: torch.Tensor,
    batch: dict[str, torch.Tensor],
    advantages: torch.Tensor,
    s: GrpoLoss,
    importance: torch.Tensor | None = None,
) -> torch.Tensor:
    """TRL's GRPOTrainer._compute_loss: the model forward is replaced by `logps` (the policy's
    per-token log-probs, differentiable), all else is TRL's method as it runs with one process,
    no accumulation, no vLLM, no entropy masking; `batch["old"]` is what TRL's
    `_generate_and_score_completions` stores as old_per_token_logps when num_iterations > 1;
    `importance`: vLLM's importance_sampling_ratio (then TRL runs with use_vllm=True)."""
    accelerator = SimpleNamespace(
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction: x,
        num_processes=1,
        sync_gradients=True,
    )
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=s.beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        loss_type=s.loss_type,
        epsilon_low=s.epsilon_low,
        epsilon_high=s.epsilon_high,
        use_vllm=importance is not None,
        vllm_importance_sampling_correction=True,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=s.max_completion_tokens,
        accelerator=accelerator,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    n = len(logps)
    inputs = {
        "prompt_ids": torch.zeros(n, 2, dtype=torch.long),
        "prompt_mask": torch.ones(n, 2, dtype=torch.long),
        "completion_ids": torch.zeros(n, T, dtype=torch.long),
        "completion_mask": batch["mask"],
        "advantages": advantages,
        "old_per_token_logps": batch["old"],
        "ref_per_token_logps": batch["ref"],
        "num_items_in_batch": batch["mask"].sum(),
    }
    if importance is not None:
        inputs["importance_sampling_ratio"] = importance
    grpo_trainer, _ = trl_grpo()
    return grpo_trainer._compute_loss(fake, None, inputs)


def trl_advantages(
    rewards_per_func: torch.Tensor, weights: list[float], scale: str
) -> torch.Tensor:
    """TRL's own advantage code: the sum_then_normalize block of
    GRPOTrainer._generate_and_score_completions, cut from its source and executed as written."""
    grpo_trainer, nanstd = trl_grpo()
    source = inspect.getsource(grpo_trainer._generate_and_score_completions)
    start = source.index('if self.multi_objective_aggregation == "sum_then_normalize":')
    end = source.index('elif self.multi_objective_aggregation == "normalize_then_sum":')
    block = textwrap.dedent(source[start:end].split("\n", 1)[1])
    scope: dict[str, Any] = {
        "self": SimpleNamespace(
            reward_weights=torch.tensor(weights, dtype=torch.float64), scale_rewards=scale
        ),
        "rewards_per_func": rewards_per_func,
        "num_generations": G,
        "unscorable_mask": torch.zeros(len(rewards_per_func), dtype=torch.bool),
        "device": "cpu",
        "torch": torch,
        "nanstd": nanstd,
    }
    exec(block, scope)  # TRL's installed source: the reference under test
    return scope["advantages"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_gradient_equal_trl(loss_type: str, beta: float) -> None:
    batch = fixed_batch()
    s = GrpoLoss(
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.28,
        beta=beta,
        max_completion_tokens=T + 1,
    )
    advantages = group_advantages(batch["rewards"], G)
    expected_loss, expected_grad = trl_loss(batch, advantages, s)

    logps = batch["logps"].clone().requires_grad_(True)
    sums, units = grpo_stats(logps, batch["old"], advantages, batch["mask"], s, batch["ref"])
    loss = sums[0] / units
    loss.backward()
    assert abs(loss.item() - expected_loss.item()) < 1e-4
    assert torch.allclose(logps.grad, expected_grad, atol=1e-4, rtol=0)
    assert expected_grad.abs().sum() > 0  # the comparison is not between two zero gradients
    assert sums[2] > 0  # some tokens were clipped: the clip branch is exercised


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_several_updates_per_rollout_equal_trl(loss_type: str) -> None:
    """grpo_num_iterations=3 (TRL's num_iterations): one rollout, its old log-probs taken before
    the first update, three updates of a small policy (per-token logits over 5 tokens as the
    parameters). Each update's loss and gradient equal TRL's with the same old log-probs; the
    ratio is 1 on the first (nothing clipped) and moves on the later ones (the clip acts)."""
    batch = fixed_batch(seed=2)
    gen = torch.Generator().manual_seed(3)
    n = G * PROMPTS
    weights = torch.randn(n, T, 5, generator=gen, dtype=torch.float64)
    tokens = torch.randint(5, (n, T, 1), generator=gen)

    def policy(w: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(w, -1).gather(-1, tokens).squeeze(-1)

    s = GrpoLoss(loss_type=loss_type, beta=0.04, max_completion_tokens=T)
    advantages = group_advantages(batch["rewards"], G)
    rollout = {**batch, "old": policy(weights).detach()}  # taken at generation time
    ours = weights.clone().requires_grad_(True)
    theirs = weights.clone().requires_grad_(True)
    clipped = []
    for _ in range(3):
        sums, units = grpo_stats(
            policy(ours), rollout["old"], advantages, batch["mask"], s, batch["ref"]
        )
        loss = sums[0] / units
        loss.backward()
        expected = trl_compute_loss(policy(theirs), rollout, advantages, s)
        expected.backward()
        assert abs(loss.item() - expected.item()) < 1e-4
        assert theirs.grad is not None and ours.grad is not None
        assert torch.allclose(ours.grad, theirs.grad, atol=1e-4, rtol=0)
        assert theirs.grad.abs().sum() > 0
        clipped.append(float(sums[2].detach()))
        with torch.no_grad():  # the same SGD update of both copies
            for w in (ours, theirs):
                assert w.grad is not None
                w -= 30.0 * w.grad
                w.grad = None
    assert clipped[0] == 0 and clipped[-1] > 0


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_accumulation_over_completions_equals_one_batch(loss_type: str) -> None:
    """Two micro-batches of whole groups, sums added and divided by the summed units, give the
    gradient of the whole batch (what trainer/step.py does across micro-batches and ranks)."""
    batch = fixed_batch(seed=1)
    s = GrpoLoss(loss_type=loss_type, beta=0.04, max_completion_tokens=T)
    adv = group_advantages(batch["rewards"], G)
    whole = batch["logps"].clone().requires_grad_(True)
    sums, units = grpo_stats(whole, batch["old"], adv, batch["mask"], s, batch["ref"])
    (sums[0] / units).backward()
    parts = batch["logps"].clone().requires_grad_(True)
    total_units, numerators = 0, []
    for rows in (slice(0, G), slice(G, None)):
        part, u = grpo_stats(
            parts[rows], batch["old"][rows], adv[rows], batch["mask"][rows], s, batch["ref"][rows]
        )
        numerators.append(part[0])
        total_units += u
    (sum(numerators) / total_units).backward()
    assert torch.allclose(whole.grad, parts.grad, atol=1e-10)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_equal_trl(scale: str) -> None:
    per_func = torch.tensor(
        [
            [1, 0],
            [0, 1],
            [1, 1],
            [0, 0],
            [1, 0],
            [1, 0],
            [1, 0],
            [1, 0],
            [0, 1],
            [0, 0],
            [1, 1],
            [0.5, 0],
        ],
        dtype=torch.float64,
    )
    weights = [1.0, 0.3]
    rewards = (per_func * torch.tensor(weights, dtype=torch.float64)).sum(1)
    ours = group_advantages(rewards, G, scale)
    assert torch.allclose(ours, trl_advantages(per_func, weights, scale), atol=1e-12)


def test_builtin_rewards_weighted() -> None:
    rewards = parse_rewards(
        '[{"name": "exact_match", "column": "answer", "extract": "last_number"},'
        ' {"name": "regex", "pattern": "\\\\d+", "weight": 0.5},'
        ' {"name": "json_schema", "schema": {"type": "object", "required": ["a"]}, "weight": 2},'
        ' {"name": "length_penalty", "max_chars": 10, "weight": 0.1}]'
    )
    completions = ["The answer is 42.", "42", '{"a": 1}', '{"b": 1}', "x" * 30]
    prompts = ["p"] * len(completions)
    table = score(rewards, completions, prompts, {"answer": ["42", "42.0", "7", "7", "7"]})
    assert table == [
        [1.0, 0.0, 0.0, -0.7],
        [1.0, 1.0, 0.5, 0.0],  # "42" parses as JSON but is not an object
        [0.0, 0.0, 1.0, 0.0],
        [0.0, 0.0, 0.5, 0.0],
        [0.0, 0.0, 0.0, -1.0],
    ]
    assert total(table, rewards) == pytest.approx([1.0 - 0.07, 2.5, 2.0, 1.0, -0.1])
    assert normalize("  1,000. ") == normalize("1000") == "1000"
    assert normalize("Paris!") == "paris"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("not json", "JSON list"),
        ('[{"name": "bleu"}]', "unknown reward 'bleu'"),
        ('[{"name": "regex", "pattern": "("}]', "rewards[0] (regex)"),
        ('[{"name": "exact_match"}]', "'column'"),
        ('[{"name": "length_penalty", "max_chars": 0}]', "max_chars must be a positive integer"),
        ('[{"name": "regex", "pattern": "a", "weight": "x"}]', "weight must be a finite number"),
    ],
)
def test_bad_reward_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        parse_rewards(spec)
    assert message in str(err.value)


USER_MODULE = """
import math

def reward(completions, prompts, **columns):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, columns["answer"])]

def raises_on_x(completions, prompts, **columns):
    return [1 / 0 if c == "x" else 1.0 for c in completions]

def short(completions, prompts, **columns):
    return [1.0]

def nan(completions, prompts, **columns):
    return [math.nan for _ in completions]
"""


def test_user_module_checked_without_running_then_loaded(tmp_path: Path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text("raise SystemExit('must not run at check time')\n" + USER_MODULE)
    assert reward_module.check(str(path)) is None
    assert reward_module.check(f"{path}:short") is None
    assert "does not define nothing_here" in (reward_module.check(f"{path}:nothing_here") or "")
    assert "does not exist" in (reward_module.check(str(tmp_path / "none.py")) or "")
    bad = tmp_path / "bad.py"
    bad.write_text("def reward(:\n")
    assert "not valid Python" in (reward_module.check(str(bad)) or "")
    assert reward_module.split("gs://b/r.py:score") == ("gs://b/r.py", "score")
    assert reward_module.split("gs://b/r.py") == ("gs://b/r.py", "reward")

    path.write_text(USER_MODULE)
    good = reward_module.load(str(path), weight=2.0)
    assert score([good], ["4", " 5 "], ["2+2", "2+3"], {"answer": ["4", "6"]}) == [[1.0], [0.0]]


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (
            "raises_on_x",
            "reward raises_on_x (%s) raised ZeroDivisionError: division by zero on record r1",
        ),
        ("short", "reward short (%s) returned 1 values for 3 completions"),
        ("nan", "reward nan (%s) returned nan for record r0"),
    ],
)
def test_user_reward_errors_name_function_and_record(
    tmp_path: Path, function: str, message: str
) -> None:
    path = tmp_path / "r.py"
    path.write_text(USER_MODULE)
    fn = reward_module.load(f"{path}:{function}")
    with pytest.raises(RewardError) as err:
        score(
            [fn],
            ["a", "x", "b"],
            ["p0", "p1", "p2"],
            {"answer": ["a", "b", "c"]},
            ["r0", "r1", "r2"],
        )
    assert str(err.value).startswith(message % path)


@pytest.fixture(scope="module")
def tiny_lora(tiny_model_dir: Path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return model, tokenizer


def test_rollout_log_probs_equal_unpadded_forward(tiny_lora) -> None:
    """Left-padded prompts of unequal length, G completions each: every completion's log-probs equal
    those of its own unpadded prompt+completion forward (positions and masks are right)."""
    from trainer.grpo.rollout import Sampling, completion_logps, sample

    model, tokenizer = tiny_lora
    prompts = ["hi", [{"role": "user", "content": "What is the capital of a very large country?"}]]
    rollout = sample(model, tokenizer, prompts, Sampling(group_size=3, max_completion_tokens=6))
    assert rollout.completion_ids.shape[0] == len(rollout.completions) == 6
    mask = rollout.completion_mask
    assert (mask[:, 0] == 1).all() and (mask[:, 1:] <= mask[:, :-1]).all()  # a prefix of each row
    with torch.no_grad():
        batched = completion_logps(model, rollout, temperature=0.7)
        for i in range(6):
            prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()]
            completion = rollout.completion_ids[i][mask[i].bool()]
            ids = torch.cat([prompt, completion])[None]
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.7
            alone = torch.log_softmax(logits, -1).gather(-1, completion[:, None]).squeeze(-1)
            assert torch.allclose(batched[i][: len(completion)], alone, atol=1e-4)


def test_grpo_step_trains_the_adapters_with_a_reference(tiny_lora) -> None:
    from trainer.grpo.loss import GrpoLoss
    from trainer.grpo.policy_step import GrpoSettings, grpo_step
    from trainer.grpo.rollout import Sampling

    model, tokenizer = tiny_lora
    records = [{"id": f"q{i}", "prompt": f"say {i}", "answer": str(i)} for i in range(3)]
    # Rewards that differ within every group: non-zero advantages whatever the tiny model writes.
    alternate = Reward(
        "alternate",
        lambda completions, prompts, **c: [float(i % 2) for i in range(len(completions))],
        1.0,
    )
    rewards = [alternate]
    lora = [p for n, p in model.named_parameters() if "lora_B" in n]
    before = [p.detach().clone() for p in lora]
    settings = GrpoSettings(
        sampling=Sampling(group_size=4, max_completion_tokens=8),
        loss=GrpoLoss(loss_type="grpo", beta=0.1, max_completion_tokens=8),
        micro_batch=5,  # not a multiple of G: accumulation crosses groups
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    report = grpo_step(model, tokenizer, optimizer, records, rewards, settings)
    assert report.completion_tokens > 0 and report.generate_s > 0 and report.train_s > 0
    assert report.kl == pytest.approx(0.0, abs=1e-6)  # B = 0 at init: policy equals reference
    assert any(not torch.equal(a, b) for a, b in zip(before, lora, strict=True))


def test_kv_cache_estimate_equals_the_cache_generate_holds(tiny_lora) -> None:
    """trainer/memory_model.kv_cache_bytes against the bytes of the cache transformers builds."""
    import json

    from trainer.memory_model import ModelShape, kv_cache_bytes

    model, tokenizer = tiny_lora
    config = json.loads(
        Path(model.base_model.model.config._name_or_path, "config.json").read_text()
    )
    shape = ModelShape.from_hf_config(config, params=sum(p.numel() for p in model.parameters()))
    ids = tokenizer(["a b c d e f"] * 3, return_tensors="pt").input_ids
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    held = sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    assert kv_cache_bytes(shape, sequences=3, tokens=ids.size(1), dtype_bytes=4) == held
