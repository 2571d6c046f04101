"""Stage a Hugging Face Hub dataset split to Parquet, once per resolved commit.

`stage(uri, stage_dir)` resolves `hf://datasets/ORG/NAME[@REVISION][:SPLIT]` to its commit sha
(`huggingface_hub.snapshot_download`, which also serves an offline cache under
`HF_HUB_OFFLINE=1`), loads the split with `datasets.load_dataset` from that snapshot (any layout
`datasets` understands: Parquet, JSON, CSV files, the README's configs), and writes it as Parquet
shards to `<stage_dir>/hf/ORG--NAME/<sha>/<split>/`. A `_STAGED.json` written last marks a
complete staging, which later runs reuse. The token, for private or gated datasets, is
`HF_TOKEN` from the environment (the pipeline step reads it from the secret).

Runs in the launching process, before Beam starts (never on a worker).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_preprocess.sources import HfDataset, parse_hf

log = logging.getLogger(__name__)

MARKER = "_STAGED.json"
SHARD_BYTES = 256 << 20
"""Arrow bytes per staged Parquet file: big enough to be few, small enough to spread."""


def default_stage_dir() -> str:
    """A local cache (`~/.cache/llmft/staged`), for local runs without a `--stage-dir`."""
    return os.path.join(os.path.expanduser("~"), ".cache", "llmft", "staged")


def stage(uri: str, stage_dir: str) -> dict[str, Any]:
    """Stage one `hf://` input; returns its lineage: {"uri", "repo", "revision" (the commit sha),
    "requested_revision", "split", "rows", "staged" (the Parquet glob)}."""
    dataset = parse_hf(uri)
    snapshot = _snapshot(dataset)
    sha = os.path.basename(snapshot.rstrip("/"))
    target = f"{stage_dir.rstrip('/')}/hf/{dataset.repo.replace('/', '--')}/{sha}/{dataset.split}"
    lineage: dict[str, Any] = {
        "uri": uri,
        "repo": dataset.repo,
        "requested_revision": dataset.revision,
        "revision": sha,
        "split": dataset.split,
        "staged": f"{target}/*.parquet",
    }
    marker = f"{target}/{MARKER}"
    if FileSystems.exists(marker):
        with FileSystems.open(marker) as f:
            lineage["rows"] = json.loads(f.read())["rows"]
        log.info("%s@%s is staged already in %s", dataset.repo, sha, target)
        return lineage
    rows = _write_parquet(_load_split(snapshot, dataset), target)
    lineage["rows"] = rows
    with FileSystems.create(marker) as f:
        f.write(json.dumps(lineage, indent=2, sort_keys=True).encode())
    log.info("staged %s rows of %s@%s:%s to %s", rows, dataset.repo, sha, dataset.split, target)
    return lineage


def _snapshot(dataset: HfDataset) -> str:
    """The local snapshot directory of the dataset at its revision (named by the commit sha)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return snapshot_download(dataset.repo, repo_type="dataset", revision=dataset.revision)
    except LocalEntryNotFoundError as exc:
        raise ValueError(
            f"hf://datasets/{dataset.repo}@{dataset.revision} is neither reachable nor in the "
            f"local Hugging Face cache ({exc}): check the name, the network or HF_HUB_OFFLINE"
        ) from None
    except HfHubHTTPError as exc:
        raise ValueError(
            f"cannot download hf://datasets/{dataset.repo}@{dataset.revision}: {exc}: check the "
            "name and revision, and for a private or gated dataset the token in hf_token_secret"
        ) from None


def _load_split(snapshot: str, dataset: HfDataset) -> Any:
    import datasets

    try:
        return datasets.load_dataset(snapshot, split=dataset.split)
    except ValueError as exc:  # an unknown split names the ones there are
        raise ValueError(f"hf://datasets/{dataset.repo}: {exc}") from None


def _write_parquet(split: Any, target: str) -> int:
    """The split as Parquet shards of about SHARD_BYTES of Arrow data; returns its rows."""
    shards = max(1, math.ceil(split.data.nbytes / SHARD_BYTES))
    for index in range(shards):
        buffer = io.BytesIO()
        split.shard(shards, index, contiguous=True).to_parquet(buffer)
        with FileSystems.create(f"{target}/part-{index:05d}-of-{shards:05d}.parquet") as f:
            f.write(buffer.getvalue())
    return len(split)
