"""A tiny Llama-architecture causal LM and a byte-level BPE tokenizer trained on the sample data.

Run: `llmft tiny-model OUT_DIR [--data SAMPLE_DIR]`. The result is an ordinary Hugging Face model
directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with a chat
template): everything downstream loads it with `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained`, the code path a real checkpoint takes. Nothing is downloaded.

Chat template: `<|user|>PROMPT<|end|><|assistant|>RESPONSE<|end|>`; `<|end|>` is the EOS token, so
generation stops at the end of the assistant turn, and a prompt rendered with
`add_generation_prompt=True` is a token-exact prefix of the full conversation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pipelines.quickstart.sample_data import generate_records

SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _texts(data_dir: Path | None) -> Iterator[str]:
    if data_dir is not None and (data_dir / "train.jsonl").exists():
        for line in (data_dir / "train.jsonl").read_text().splitlines():
            record = json.loads(line)
            yield record["prompt"]
            yield record["response"]
    else:
        for record in generate_records(4000, seed=0):
            yield record["prompt"]
            yield record["response"]


def train_tokenizer(data_dir: Path | None = None, vocab_size: int = 4096):
    """Train a byte-level BPE tokenizer and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_texts(data_dir), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>", model_max_length=4096
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _shape_errors(vocab_size: int, hidden_size: int, layers: int, heads: int) -> list[str]:
    """What is wrong with the asked shape, checked before anything is built or written (Llama's
    own check is a traceback after the tokenizer was trained; a vocabulary below the byte
    alphabet was silently raised to it)."""
    errors = []
    smallest = 256 + len(SPECIAL_TOKENS)  # byte-level BPE: every byte, then the special tokens
    if vocab_size < smallest:
        errors.append(
            f"--vocab-size must be >= {smallest} (256 bytes + {len(SPECIAL_TOKENS)} special tokens); got {vocab_size}"
        )
    if layers < 1:
        errors.append(f"--layers must be >= 1 (got {layers})")
    if hidden_size < 1 or hidden_size % (2 * heads):
        errors.append(
            f"--hidden-size must be a positive multiple of {2 * heads} ({heads} attention heads of "
            f"an even size); got {hidden_size}"
        )
    return errors


def build_tiny_model(
    out_dir: str | Path,
    data_dir: str | Path | None = None,
    vocab_size: int = 4096,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 688,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> dict:
    """Build, randomly initialise (seeded) and save the tiny model and its tokenizer."""
    if problems := _shape_errors(vocab_size, hidden_size, num_layers, num_heads):
        raise ValueError("; ".join(problems))
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # one tiny shard: a bar would only be noise
    out = Path(out_dir)
    tokenizer = train_tokenizer(Path(data_dir) if data_dir else None, vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    return {"path": str(out), "parameters": n_params, "vocab_size": len(tokenizer)}
