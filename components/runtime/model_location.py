"""Where a model reference points: a Hugging Face Hub id or a path (local or remote).

A base model is a local path, a gs:// URI of a model directory, a `.gguf` file (trainer/gguf.py)
or a Hub id; the steps that size, load or tokenize it ask here which one it is.
"""

from __future__ import annotations

import os
import re

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(path: str) -> bool:
    """`org/name` that is not a local path: a Hugging Face Hub model id (the pipeline accepts
    them as base models; from_pretrained downloads them, with HF_TOKEN from the environment)."""
    return bool(_HUB_ID.match(path)) and not os.path.exists(path)
