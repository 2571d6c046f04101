"""Regenerate infra/dataflow/preprocess-metadata.json: `python -m llmft_infra` (from infra/)."""

import json
from pathlib import Path

from beam_preprocess.flex_template import metadata

path = Path(__file__).resolve().parents[1] / "dataflow" / "preprocess-metadata.json"
path.write_text(json.dumps(metadata(), indent=2) + "\n")
print(f"wrote {path}")
