"""Fault: compressed inputs crashed, and one pathological record or page killed the whole run
(issue 37, second bullet).

`train.jsonl.gz` failed with `'CompressedFile' object is not iterable` and `.csv.gz` with
`'writable'`, though inputs may be compressed; a 200,000-deep nested JSON record raised a
RecursionError and a Parquet file with a corrupt page an OSError, each a traceback naming neither
the file nor the record. Now compressed files are read, and the broken record or row group becomes
dead letters naming its file (and row group), while the rest is read.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from faults.conftest import instruction_rows, preprocess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _corrupt_parquet(path: Path, rows: list[dict[str, str]]) -> None:
    """Two row groups of 20 rows; the first one's first page header overwritten with junk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=20, compression="none")
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    offset = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))


def test_compressed_deep_and_corrupt_inputs(tiny_model_dir: Path, tmp_path: Path):
    with gzip.open(tmp_path / "train.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in instruction_rows(30, "gz-jsonl"))
    with gzip.open(tmp_path / "train.csv.gz", "wt", encoding="utf-8", newline="") as f:
        f.write("prompt,response\n")
        f.writelines(f"{r['prompt']},{r['response']}\n" for r in instruction_rows(30, "gz-csv"))
    deep = '{"prompt": ' + "[" * 200_000 + "]" * 200_000 + ', "response": "r"}'
    lines = [json.dumps(r) for r in instruction_rows(10, "deep")]
    lines.insert(4, deep)
    (tmp_path / "deep.jsonl").write_text("\n".join(lines) + "\n")
    _corrupt_parquet(tmp_path / "pages.parquet", instruction_rows(40, "parquet"))

    inputs = ["train.jsonl.gz", "train.csv.gz", "deep.jsonl", "pages.parquet"]
    stats, letters = preprocess(
        [tmp_path / name for name in inputs],
        tmp_path / "out",
        tiny_model_dir,
        "--max-rejected-fraction=0.5",
    )

    assert stats["records_read"] == 30 + 30 + 11 + 40
    assert stats["kept"] == 30 + 30 + 10 + 20
    assert stats["rejected_by_reason"] == {"invalid_json": 1, "invalid_parquet": 20}
    deep_letter = next(x for x in letters if x["reason"] == "invalid_json")
    assert deep_letter["source"].endswith("deep.jsonl:5")
    assert "nested too deeply" in deep_letter["error"]
    lost = sorted(
        int(x["source"].rsplit("#", 1)[1]) for x in letters if x["reason"] == "invalid_parquet"
    )
    assert lost == list(range(20))  # the first row group, each row named; the second is read
    parquet_error = next(x["error"] for x in letters if x["reason"] == "invalid_parquet")
    assert "pages.parquet" in parquet_error and "row group 0" in parquet_error
