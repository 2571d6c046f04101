"""Which `attention` setting computes a model's attention exactly, decided from its config and its
transformers class alone (no torch, no weights): `llmft train`'s preflight refuses before any
process starts (components/preflight/launch_checks.py) and every trainer rank refuses identically
(trainer/attention.py, trainer/startup.py).
"""

from __future__ import annotations

from typing import Any

MASKS_IGNORE_POSITIONS = ("gpt_oss",)
"""Model types whose decoder builds its attention masks without `position_ids` (transformers
5.24): their own eager/SDPA attention lets packed documents see each other (found by
tests/test_model_families.py), so only attention=document is exact for them."""


def support_errors(setting: str, hf_config: Any) -> list[str]:
    """Why `attention=setting` would not compute this model's attention exactly (empty: it does).

    Decided from the model's config and its transformers class, so `llmft train` can refuse before
    any process starts and every trainer rank refuses identically.
    """
    from transformers import AutoModelForCausalLM

    mapping = AutoModelForCausalLM._model_mapping
    model_class: Any = mapping.get(type(hf_config), None)
    name = getattr(hf_config, "model_type", type(hf_config).__name__)
    if model_class is None:
        return [f"model type {name!r} is not a causal LM transformers knows"]
    if hf_config.get_text_config() is not hf_config:
        return [
            f"model type {name!r} is a multimodal checkpoint ({model_class.__name__}); the trainer "
            "fine-tunes text-only causal LMs: use the family's text-only checkpoint"
        ]
    if setting == "document":
        if getattr(hf_config, "attention_chunk_size", None):
            return [
                f"model type {name!r} uses chunked attention (attention_chunk_size), which "
                "attention=document does not compute: set attention=eager"
            ]
        if not getattr(model_class, "_supports_attention_backend", False):
            return [
                f"model type {name!r} does not call pluggable attention, so attention=document "
                "would not apply: set attention=sdpa or attention=eager"
            ]
    if setting != "document" and name in MASKS_IGNORE_POSITIONS:
        return [
            f"attention={setting} runs the own attention of model type {name!r}, whose masks ignore "
            "packed document boundaries (position_ids): set attention=document (exact)"
        ]
    if setting == "sdpa" and not getattr(model_class, "_supports_sdpa", False):
        if getattr(hf_config, "attn_logit_softcapping", None):
            feature = "attention-logit soft-capping (attn_logit_softcapping)"
        elif name == "gpt_oss":
            feature = "attention sinks"
        else:
            feature = "its attention variant"
        return [
            f"attention=sdpa cannot compute {feature} of model type {name!r}: set "
            "attention=document (exact, the fastest) or attention=eager"
        ]
    return []


def check_model(setting: str, model_dir: str) -> None:
    """Refuse (ValueError) when `attention=setting` is not exact for the model in `model_dir`."""
    from transformers import AutoConfig

    errors = support_errors(setting, AutoConfig.from_pretrained(model_dir))
    if errors:
        raise ValueError(f"model {model_dir}: " + "; ".join(errors))
