"""Fault: one bad CSV row used to end the file silently (issue 37, first bullet).

A field over Python's default 128 KiB csv limit, or one byte that is not UTF-8, made the reader stop
at that row: every later row was neither read nor counted, and the run exited 0. Now each bad row
is its own dead letter, every other row is read, and `records_read` counts every row.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from faults.conftest import instruction_rows, preprocess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _csv(rows: list[dict[str, str]]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=["prompt", "response"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def test_bad_csv_rows_are_dead_letters_and_the_rest_is_read(tiny_model_dir: Path, tmp_path: Path):
    from beam_preprocess.parsers import CSV_FIELD_LIMIT

    # 100 rows: row 11 holds a field over the (raised) limit, row 31 a 200 KB field that the
    # old 128 KiB limit refused and the new one reads (then the length filter drops it).
    long_rows = instruction_rows(100, "long")
    long_rows[10]["response"] = "x" * (CSV_FIELD_LIMIT + 1)
    long_rows[30]["response"] = "y" * 200_000
    (tmp_path / "long.csv").write_text(_csv(long_rows))
    # 20 rows: a bad byte in the first data row (inside the reader's first buffer).
    bad = _csv(instruction_rows(20, "bytes")).encode()
    bad = bad.replace(b"bytes question 0:", b"bytes question \xff0:", 1)
    (tmp_path / "bad.csv").write_bytes(bad)

    stats, letters = preprocess(
        [tmp_path / "long.csv", tmp_path / "bad.csv"], tmp_path / "out", tiny_model_dir
    )

    assert stats["records_read"] == 120
    assert stats["rejected_by_reason"] == {"invalid_csv": 1, "invalid_utf8": 1}
    by_source = {letter["source"].rsplit("/", 1)[1]: letter for letter in letters}
    assert set(by_source) == {"long.csv:12", "bad.csv:2"}  # file line = row + 1 (the header)
    assert "field larger than field limit" in by_source["long.csv:12"]["error"]
    assert by_source["bad.csv:2"]["reason"] == "invalid_utf8"
    assert "\ufffd" in by_source["bad.csv:2"]["record"][0]  # the bad byte shown, replaced
    # Every row is accounted for: kept, filtered (the 200 KB one is too long) or rejected.
    assert stats["kept"] + stats["filtered"] + stats["duplicates"] + stats["rejected"] == 120
    assert stats["kept"] == 117
