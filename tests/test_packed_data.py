"""trainer/packed_data: the one shard reader on small synthetic datasets, and its neutrality."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainer.packed_data.format import (
    COLUMNS,
    EVAL_SPLIT,
    MANIFEST_FILE,
    Manifest,
    SplitInfo,
    TokenizerIdentity,
    read_manifest,
)
from trainer.packed_data.reader import read_selected, read_split, shard_paths, shard_row_counts

SEQ_LEN = 8


def _write_dataset(out: Path, shard_rows: list[int], corrupt_last: bool = False) -> Manifest:
    """An eval split of `shard_rows` rows per shard; row r holds the token id r everywhere.

    Each row is two documents (positions restart at 4) with loss_mask 1 on every token, so the
    reader's first-token rule is visible. `corrupt_last` writes the last shard one token short.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    (out / EVAL_SPLIT).mkdir(parents=True)
    shards, first = [], 0
    for n, rows in enumerate(shard_rows):
        length = SEQ_LEN - 1 if corrupt_last and n == len(shard_rows) - 1 else SEQ_LEN
        ids = [[first + r] * length for r in range(rows)]
        positions = [[i % (SEQ_LEN // 2) for i in range(length)] for _ in range(rows)]
        table = pa.table(
            {"input_ids": ids, "loss_mask": [[1] * length] * rows, "position_ids": positions}
        )
        rel = f"{EVAL_SPLIT}/part-{n:05d}.parquet"
        pq.write_table(table, out / rel)
        shards.append(rel)
        first += rows
    manifest = Manifest(
        seq_len=SEQ_LEN,
        tokenizer=TokenizerIdentity("tok", 100, 1, 0, None, "f" * 64),
        data_kind="text",
        splits={EVAL_SPLIT: SplitInfo(rows=sum(shard_rows), shards=shards)},
        stats={},
    )
    (out / MANIFEST_FILE).write_text(manifest.to_json())
    return read_manifest(str(out))


def test_read_split_stops_at_max_rows_without_opening_later_shards(tmp_path: Path) -> None:
    manifest = _write_dataset(tmp_path, [4, 4, 4], corrupt_last=True)
    rows = read_split(str(tmp_path), manifest, EVAL_SPLIT, max_rows=5)
    assert rows.input_ids.shape == (5, SEQ_LEN) and rows.input_ids.dtype == np.int32
    assert rows.input_ids[:, 0].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"part-00002.parquet: row 0 has 7 input_ids values.*"):
        read_split(str(tmp_path), manifest, EVAL_SPLIT)  # the corrupt shard, once it is read


def test_read_selected_returns_rows_in_the_order_asked(tmp_path: Path) -> None:
    manifest = _write_dataset(tmp_path, [3, 5, 2])
    paths = shard_paths(str(tmp_path), manifest, EVAL_SPLIT)
    counts = shard_row_counts(paths)
    assert counts == [3, 5, 2]
    wanted = np.array([9, 0, 4, 3, 7])
    rows = read_selected(paths, counts, SEQ_LEN, wanted)
    assert rows.input_ids[:, 0].tolist() == wanted.tolist()
    assert len(rows) == 5 and len(rows.slice(1, 3)) == 2
    assert len(read_selected(paths, counts, SEQ_LEN, np.array([], dtype=np.int64))) == 0


def test_a_documents_first_token_is_never_a_target(tmp_path: Path) -> None:
    manifest = _write_dataset(tmp_path, [2])
    rows = read_split(str(tmp_path), manifest, EVAL_SPLIT)
    assert (rows.loss_mask[rows.position_ids == 0] == 0).all()
    assert (rows.loss_mask[rows.position_ids != 0] == 1).all()
    assert set(COLUMNS) == {"input_ids", "loss_mask", "position_ids"}


@pytest.mark.integration  # a fresh interpreter
def test_the_format_package_imports_no_torch_beam_or_transformers() -> None:
    """Beam workers, the trainer and evaluation all import it: it must stay light."""
    code = (
        "import sys, trainer.packed_data.format, trainer.packed_data.reader, trainer.storage; "
        "heavy = [m for m in ('torch', 'apache_beam', 'transformers', 'beam_preprocess', "
        "'components', 'pipelines') if m in sys.modules]; assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
