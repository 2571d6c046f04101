"""Read packed rows: the one shard reader, used by the trainer's data pipeline and by evaluation.

Rows come back as `PackedRows`: three int32 numpy arrays of shape [rows, seq_len], decoded from
Arrow in one pass per column (no Python object per token), so reading stays off the training
step's critical path. `read_selected` reads only the shards that hold the requested rows.

Every read enforces two rules of the format: each row is exactly seq_len long (else the dataset
is corrupt), and the first token of a document (position 0) is never a target, whatever the
writer did, so no loss ever crosses a document boundary. Page checksums are verified (writers set
them: format.PARQUET_WRITE_OPTIONS). A shard that is missing, truncated or overwritten raises
`CorruptShard` (a ValueError naming the shard); `shard_problems` finds them all up front.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer import storage
from trainer.packed_data.format import COLUMNS, PAIR_COLUMN, Manifest


@dataclass(frozen=True)
class PackedRows:
    """Packed sequences: one int32 array of shape [rows, seq_len] per column of the format."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    """1 where the token is a target (predicted from the token before it)."""
    position_ids: np.ndarray
    pair_ids: np.ndarray | None = None
    """Preference datasets only: the pair document of each token (format.py), else None."""

    def __len__(self) -> int:
        return len(self.input_ids)

    def columns(self) -> tuple[str, ...]:
        """The columns these rows hold (COLUMNS, plus `pair_ids` for preference data)."""
        return COLUMNS if self.pair_ids is None else (*COLUMNS, PAIR_COLUMN)

    def map(self, fn: Any) -> PackedRows:
        """The same columns, each array passed through `fn`."""
        return PackedRows(**{name: fn(getattr(self, name)) for name in self.columns()})

    def slice(self, lo: int, hi: int) -> PackedRows:
        """Rows [lo, hi) (views, no copy)."""
        return self.map(lambda column: column[lo:hi])

    @classmethod
    def concat(cls, parts: list[PackedRows], seq_len: int) -> PackedRows:
        """The rows of `parts`, in order (an empty [0, seq_len] set when there are none)."""
        if not parts:
            return cls(*(np.zeros((0, seq_len), np.int32) for _ in COLUMNS))
        names = parts[0].columns()
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in names})


class CorruptShard(ValueError):
    """A shard that is missing or does not read as the format says (truncated, overwritten)."""


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    """Turn a shard that cannot be read into CorruptShard (a permission problem stays what it is)."""
    import pyarrow as pa

    try:
        yield
    except FileNotFoundError:
        raise CorruptShard(
            f"shard {path} is missing: the dataset is incomplete, re-run `llmft preprocess`"
        ) from None
    except PermissionError:
        raise
    except (OSError, pa.ArrowException) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CorruptShard(
            f"shard {path} is damaged ({reason}): re-run `llmft preprocess` (or restore the file)"
        ) from None


def _open_parquet(f: Any) -> Any:
    import pyarrow.parquet as pq

    return pq.ParquetFile(f, page_checksum_verification=True)


def shard_paths(data_dir: str, manifest: Manifest, split: str) -> list[str]:
    """The split's shard files, in manifest order (none for a split the manifest lacks)."""
    info = manifest.splits.get(split)
    return [] if info is None else [storage.join(data_dir, rel) for rel in info.shards]


def shard_row_counts(paths: list[str]) -> list[int]:
    """Rows per shard, from the Parquet footers only."""
    import pyarrow.parquet as pq

    counts = []
    for path in paths:
        with _reading(path), storage.open(path, "rb") as f:
            counts.append(pq.ParquetFile(f).metadata.num_rows)
    return counts


def shard_problems(data_dir: str, manifest: Manifest, *, read_pages: bool) -> list[str]:
    """Why the dataset's shards do not hold what its manifest says ([] when they do): a shard
    that is missing or whose footer does not read (truncated), a split whose shards hold another
    number of rows than the manifest's, and with `read_pages` every page read and its checksum
    verified (a shard overwritten in place), one batch at a time."""
    problems = []
    for split, info in manifest.splits.items():
        rows: int | None = 0
        for path in shard_paths(data_dir, manifest, split):
            try:
                count = shard_row_counts([path])[0]
                if read_pages:
                    with _reading(path), storage.open(path, "rb") as f:
                        for _ in _open_parquet(f).iter_batches():
                            pass
            except CorruptShard as exc:
                problems.append(str(exc))
                rows = None
                continue
            rows = None if rows is None else rows + count
        if rows is not None and rows != info.rows:
            problems.append(
                f"the {split} shards of {data_dir} hold {rows} rows, its manifest says "
                f"{info.rows}: the dataset was changed after it was written, re-run `llmft "
                "preprocess`"
            )
    return problems


def read_shard(path: str, seq_len: int, keep: np.ndarray | None = None) -> PackedRows:
    """One shard's rows (`keep`: only these row indices, in that order)."""
    with _reading(path), storage.open(path, "rb") as f:
        parquet = _open_parquet(f)
        names = [n for n in (*COLUMNS, PAIR_COLUMN) if n in parquet.schema_arrow.names]
        table = parquet.read(columns=names)
    if keep is not None:
        table = table.take(keep)
    out = {}
    for name in names:
        column = table.column(name).combine_chunks()
        lengths = np.diff(np.asarray(column.offsets))
        if len(lengths) and (lengths != seq_len).any():
            bad = int(np.flatnonzero(lengths != seq_len)[0])
            raise CorruptShard(
                f"{path}: row {bad} has {lengths[bad]} {name} values, the manifest says "
                f"seq_len={seq_len}: the dataset is corrupt, re-run preprocessing"
            )
        out[name] = np.asarray(column.flatten(), dtype=np.int32).reshape(-1, seq_len)
    out["loss_mask"] = np.where(out["position_ids"] == 0, 0, out["loss_mask"])
    return PackedRows(**out)


def read_selected(
    paths: list[str], counts: list[int], seq_len: int, rows: np.ndarray
) -> PackedRows:
    """Rows with the given global indices (in that order), reading only shards that hold some."""
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    parts = []
    start = 0
    for path, count in zip(paths, counts, strict=True):
        lo, hi = np.searchsorted(sorted_rows, [start, start + count])
        if hi > lo:
            parts.append(read_shard(path, seq_len, keep=sorted_rows[lo:hi] - start))
        start += count
    stacked = PackedRows.concat(parts, seq_len)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return stacked.map(lambda column: column[inverse])


def read_split(
    data_dir: str, manifest: Manifest, split: str, max_rows: int | None = None
) -> PackedRows:
    """The split's first `max_rows` rows (all by default) in shard order; later shards unread."""
    parts: list[PackedRows] = []
    total = 0
    for path in shard_paths(data_dir, manifest, split):
        if max_rows is not None and total >= max_rows:
            break
        parts.append(read_shard(path, manifest.seq_len))
        total += len(parts[-1])
    rows = PackedRows.concat(parts, manifest.seq_len)
    return rows if max_rows is None else rows.slice(0, max_rows)
