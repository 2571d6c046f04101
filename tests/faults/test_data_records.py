"""Faults, round 2 (issue 36), data: one hostile record or file among good ones.

Each case runs the real Beam pipeline (the in-process runner, as `llmft preprocess` does) over a
few good records and the bad ones, and states the exact outcome: every bad record one dead letter
(`rejected/`, or `filtered/` for a policy) with its reason and `path:line` / `path#row`, every
good record kept (its text is in the packed rows), `records_read` = kept + filtered + rejected,
no hidden `.temp-*` / `.shuffle-*` directory and no process left behind.

Found and fixed with these cases: a UTF-8 byte order mark cost a JSONL file its first record
(`invalid_json`) and a CSV file every record (the first column was named "\\ufeffprompt"); an
escaped lone surrogate (`"\\ud800"`), an integer of more than 4,300 digits, a string column of a
Parquet file holding bytes that are not UTF-8, a ShareGPT speaker that is a list, and a CSV
`messages` cell nested too deeply each crashed the whole run with a traceback, leaving a hidden
`.temp-*` directory in the output; a gzip file named `.jsonl` became one `invalid_utf8` dead letter
per compressed "line"; a chat turn whose content is a number was reported as empty.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from faults.conftest import instruction_rows, preprocess

pytestmark = pytest.mark.integration

HUGE_CHARS = 40_000_000
"""One record of 40 MB of text (a single JSONL line)."""


def _jsonl(rows: list[Any]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def _csv(rows: list[dict[str, str]]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def _parquet(path: Path, columns: dict[str, Any]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)


def _good_parquet(path: Path, tag: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(instruction_rows(10, tag)), path)


def _around(bad: list[str], tag: str = "good") -> str:
    """Five good JSONL lines, the bad lines (lines 6, 7, ...), five more good lines."""
    good = instruction_rows(10, tag)
    return _jsonl(good[:5]) + "".join(line + "\n" for line in bad) + _jsonl(good[5:])


def _texts(n: int, tag: str) -> list[dict[str, str]]:
    return [{"text": f"{tag} document {i}: the sum of {i} and {i} is {2 * i}."} for i in range(n)]


@dataclass
class Case:
    write: Callable[[Path], None]
    """Writes the case's input files into the directory it is given."""
    letters: dict[str, tuple[str, str, str]]
    """`file:line` (or `file#row`) -> (rejected | filtered, reason, a fragment of the error)."""
    kept: int
    kept_texts: list[str] = field(default_factory=list)
    """Text each of which must be in the packed rows (proof a record was read correctly)."""
    absent_texts: list[str] = field(default_factory=list)
    """Text that must not be in the packed rows."""
    args: tuple[str, ...] = ()


def _huge(d: Path) -> None:
    huge = json.dumps({"prompt": "huge", "response": "x " * (HUGE_CHARS // 2)})
    (d / "huge.jsonl").write_text(_around([huge]))


def _invalid_utf8(d: Path) -> None:
    good = _around([]).encode().splitlines(keepends=True)
    good.insert(5, b'{"prompt": "bad \xff byte", "response": "r"}\n')
    (d / "a.jsonl").write_bytes(b"".join(good))


def _lone_surrogate(d: Path) -> None:
    lines = [
        r'{"prompt": "lone \ud800 surrogate", "response": "r"}',
        r'{"prompt": "a pair \ud83d\ude00 is one character", "response": "kept"}',
    ]
    (d / "a.jsonl").write_text(_around(lines))
    # A CSV cell holding a conversation as JSON text, with the escape inside it.
    chats = [
        {
            "messages": json.dumps(
                [{"role": "user", "content": c}, {"role": "assistant", "content": "a"}]
            )
        }
        for c in ("csv question", "lone \ud800 in a cell")
    ]
    (d / "b.csv").write_text(_csv(chats))


def _bom(d: Path) -> None:
    bom = b"\xef\xbb\xbf"
    (d / "a.jsonl").write_bytes(bom + _jsonl(instruction_rows(10, "bom-jsonl")).encode())
    (d / "b.json").write_bytes(bom + json.dumps(instruction_rows(10, "bom-json")).encode())
    (d / "c.csv").write_bytes(bom + _csv(instruction_rows(10, "bom-csv")).encode())


def _nul(d: Path) -> None:
    lines = [
        '{"prompt": "raw \x00 nul in a string", "response": "r"}',
        r'{"prompt": "escaped\u0000nul", "response": "kept without it"}',
    ]
    (d / "a.jsonl").write_text(_around(lines))
    rows = instruction_rows(5, "nul-csv")
    rows[2]["prompt"] = "csv\x00nul"
    (d / "b.csv").write_text(_csv(rows))
    _parquet(d / "c.parquet", {"prompt": ["parquet\x00nul"], "response": ["r"]})


def _deep(d: Path) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    # A JSON array file: the deep item (index 5) cannot be parsed, the items around it can.
    items = [json.dumps(row) for row in instruction_rows(10, "deep-json")]
    items.insert(5, f'{{"prompt": {deep}, "response": "r"}}')
    (d / "a.json").write_text("[" + ",\n".join(items) + "]")
    # A CSV cell holding a conversation as JSON text (parsed by the chat shape).
    chats = [
        {
            "messages": json.dumps(
                [
                    {"role": "user", "content": f"chat question {i}"},
                    {"role": "assistant", "content": f"answer {i}"},
                ]
            )
        }
        for i in range(10)
    ]
    chats.insert(5, {"messages": deep})
    (d / "b.csv").write_text(_csv(chats))


def _wrong_types(d: Path) -> None:
    lines = [
        '{"prompt": 3, "response": true}',
        '{"prompt": "p", "response": null}',
        '{"prompt": ["a list"], "response": {"an": "object"}}',
        '{"prompt": ' + "9" * 5000 + ', "response": "r"}',
        '{"prompt": 1.5e400, "response": "r"}',
        '"a string, not an object"',
    ]
    (d / "a.jsonl").write_text(_around(lines))


def _text_types(d: Path) -> None:
    lines = ['{"text": null}', '{"text": 3}', '{"text": false}', '{"text": "  "}', "{}"]
    good = _texts(10, "text")
    (d / "a.jsonl").write_text(_jsonl(good[:5]) + "\n".join(lines) + "\n" + _jsonl(good[5:]))


def _chat(d: Path) -> None:
    def chat(*turns: tuple[Any, Any]) -> str:
        return json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]})

    lines = [
        chat(("wizard", "x"), ("assistant", "y")),
        chat(("user", ""), ("assistant", "y")),
        chat(("user", "hi"), ("assistant", "   ")),
        chat(("user", "hi")),
        chat(("system", "s"), ("user", "hi")),
        chat(("user", "hi"), ("assistant", "y"), ("user", "and?")),
        chat(("assistant", "y")),
        chat(("user", 5), ("assistant", "y")),
        chat((["user"], "x"), ("assistant", "y")),
        json.dumps({"messages": []}),
        json.dumps(
            {"conversations": [{"from": "alien", "value": "x"}, {"from": "gpt", "value": "y"}]}
        ),
        json.dumps(
            {"conversations": [{"from": ["human"], "value": "x"}, {"from": "gpt", "value": "y"}]}
        ),
    ]
    (d / "a.jsonl").write_text(_around(lines))


def _ragged(d: Path) -> None:
    rows = instruction_rows(10, "ragged")
    lines = _csv(rows).splitlines(keepends=True)
    lines[6:6] = ["one,two,three\n", "only one field\n"]
    (d / "a.csv").write_text("".join(lines))


def _parquet_schema(d: Path) -> None:
    import pyarrow as pa

    _parquet(d / "missing.parquet", {"foo": ["x"] * 3, "bar": ["y"] * 3})
    _parquet(d / "ints.parquet", {"prompt": [1, 2], "response": ["a", "b"]})
    not_utf8 = pa.array([b"fine", b"bad \xff", b"also fine"], type=pa.binary())
    _parquet(
        d / "bytes.parquet",
        {"prompt": not_utf8.view(pa.string()), "response": ["r0", "r1", "r2"]},
    )
    _good_parquet(d / "good.parquet", "parquet")


def _parquet_text_int(d: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _parquet(d / "ints.parquet", {"text": [1, 2, 3]})
    pq.write_table(pa.Table.from_pylist(_texts(10, "text-parquet")), d / "good.parquet")


def _gzip_named_jsonl(d: Path) -> None:
    (d / "a.jsonl").write_bytes(gzip.compress(_jsonl(instruction_rows(10, "gzip")).encode()))


REJECTED, FILTERED = "rejected", "filtered"
_TOO_DEEP = "nested too deeply"
_CHAT_LETTERS = {
    6: (REJECTED, "invalid_messages", "role 'wizard' is not one of"),
    7: (REJECTED, "empty_field", "messages[0].content is missing or empty"),
    8: (REJECTED, "empty_field", "messages[1].content is missing or empty"),
    9: (REJECTED, "invalid_messages", "must be the assistant's"),
    10: (REJECTED, "invalid_messages", "must be the assistant's"),
    11: (REJECTED, "invalid_messages", "must be the assistant's"),
    12: (REJECTED, "invalid_messages", "has no user message"),
    13: (REJECTED, "invalid_field_type", "messages[0].content is int, not text"),
    14: (REJECTED, "invalid_messages", "role ['user'] is not one of"),
    15: (REJECTED, "invalid_messages", "must be a non-empty list"),
    16: (REJECTED, "invalid_messages", "'alien' is not a ShareGPT speaker"),
    17: (REJECTED, "invalid_messages", "['human'] is not a ShareGPT speaker"),
}

CASES = {
    "huge_line": Case(
        _huge,
        {"huge.jsonl:6": (FILTERED, "too_long_chars", f"{HUGE_CHARS + 3} chars")},
        kept=10,
        kept_texts=["good question 4:", "good question 5:"],
    ),
    "invalid_utf8_jsonl": Case(
        _invalid_utf8,
        {"a.jsonl:6": (REJECTED, "invalid_utf8", "can't decode byte 0xff")},
        kept=10,
        kept_texts=["good question 4:", "good question 5:"],
    ),
    "lone_surrogate_escape": Case(
        _lone_surrogate,
        {
            "a.jsonl:6": (REJECTED, "invalid_utf8", "lone UTF-16 surrogate"),
            "b.csv:3": (REJECTED, "invalid_messages", "lone UTF-16 surrogate"),
        },
        kept=11 + 1,
        kept_texts=["a pair \U0001f600 is one character", "csv question"],
    ),
    "utf8_bom": Case(
        _bom,
        {},
        kept=30,
        kept_texts=["bom-jsonl question 0:", "bom-json question 0:", "bom-csv question 0:"],
        absent_texts=["\ufeff"],
    ),
    "nul_bytes": Case(
        _nul,
        {"a.jsonl:6": (REJECTED, "invalid_json", "Invalid control character")},
        kept=10 + 1 + 5 + 1,
        kept_texts=["escapednul", "csvnul", "parquetnul"],
        absent_texts=["\x00"],
    ),
    "deep_json": Case(
        _deep,
        {
            "a.json[5]": (REJECTED, "invalid_json", _TOO_DEEP),
            "b.csv:7": (REJECTED, "invalid_messages", _TOO_DEEP),
        },
        kept=10 + 10,
        kept_texts=["deep-json question 4:", "deep-json question 5:", "chat question 9"],
    ),
    "numbers_where_text_is_expected": Case(
        _wrong_types,
        {
            "a.jsonl:6": (REJECTED, "invalid_field_type", "field 'prompt' is int, not text"),
            "a.jsonl:7": (REJECTED, "missing_field", "field 'response' is null"),
            "a.jsonl:8": (REJECTED, "invalid_field_type", "field 'prompt' is list, not text"),
            "a.jsonl:9": (REJECTED, "invalid_json", "Exceeds the limit (4300 digits)"),
            "a.jsonl:10": (REJECTED, "invalid_field_type", "field 'prompt' is float, not text"),
            "a.jsonl:11": (REJECTED, "not_an_object", "expected a JSON object, got str"),
        },
        kept=10,
    ),
    "text_null_or_not_text": Case(
        _text_types,
        {
            "a.jsonl:6": (REJECTED, "missing_field", "field 'text' is null"),
            "a.jsonl:7": (REJECTED, "invalid_field_type", "field 'text' is int, not text"),
            "a.jsonl:8": (REJECTED, "invalid_field_type", "field 'text' is bool, not text"),
            "a.jsonl:9": (REJECTED, "empty_field", "field 'text' is empty"),
            "a.jsonl:10": (REJECTED, "missing_field", "field 'text' is missing"),
        },
        kept=10,
        kept_texts=["text document 9:"],
        args=("--data-kind=text",),
    ),
    "chat_turns": Case(
        _chat,
        {f"a.jsonl:{line}": letter for line, letter in _CHAT_LETTERS.items()},
        kept=10,
    ),
    "ragged_csv": Case(
        _ragged,
        {
            "a.csv:7": (REJECTED, "invalid_csv", "expected 2 fields as in the header, got 3"),
            "a.csv:8": (REJECTED, "invalid_csv", "expected 2 fields as in the header, got 1"),
        },
        kept=10,
        kept_texts=["ragged question 5:", "ragged question 9:"],
    ),
    "parquet_wrong_schema": Case(
        _parquet_schema,
        {
            **{
                f"missing.parquet#{row}": (REJECTED, "missing_field", "field 'prompt' is missing")
                for row in range(3)
            },
            **{
                f"ints.parquet#{row}": (REJECTED, "invalid_field_type", "'prompt' is int")
                for row in range(2)
            },
            "bytes.parquet#1": (REJECTED, "invalid_utf8", "a string column is not valid UTF-8"),
        },
        kept=10 + 2,
        kept_texts=["parquet question 9:", "also fine"],
    ),
    "parquet_text_column_of_ints": Case(
        _parquet_text_int,
        {
            f"ints.parquet#{row}": (REJECTED, "invalid_field_type", "field 'text' is int")
            for row in range(3)
        },
        kept=10,
        args=("--data-kind=text",),
    ),
    "gzip_named_jsonl": Case(
        _gzip_named_jsonl, {}, kept=10, kept_texts=["gzip question 0:", "gzip question 9:"]
    ),
}


def _kept_text(out: Path, tokenizer: Path) -> str:
    """Every packed row of train/ and eval/, decoded: what the model would be trained on."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    rows = [
        ids
        for shard in sorted(out.glob("*/*.parquet"))
        for ids in pq.read_table(shard, columns=["input_ids"]).column(0).to_pylist()
    ]
    return "\n".join(tok.decode(ids, skip_special_tokens=True) for ids in rows)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_record_is_one_dead_letter_and_the_rest_is_kept(
    name: str, tiny_model_dir: Path, tmp_path: Path
):
    case = CASES[name]
    inputs = tmp_path / "in"
    inputs.mkdir()
    case.write(inputs)
    out = tmp_path / "out"
    children = {p.pid for p in psutil.Process().children(recursive=True)}

    stats, rejected = preprocess(
        sorted(inputs.iterdir()),
        out,
        tiny_model_dir,
        "--max-rejected-fraction=0.9",
        *case.args,
    )

    filtered = [
        json.loads(line)
        for shard in sorted((out / "filtered").glob("*.jsonl"))
        for line in shard.read_text().splitlines()
    ]
    letters = {
        letter["source"].rsplit("/", 1)[1]: (kind, letter["reason"], letter["error"])
        for kind, group in ((REJECTED, rejected), (FILTERED, filtered))
        for letter in group
    }
    assert len(letters) == len(rejected) + len(filtered)  # one letter per record
    assert set(letters) == set(case.letters), letters
    for source, (kind, reason, fragment) in case.letters.items():
        got_kind, got_reason, error = letters[source]
        assert (got_kind, got_reason) == (kind, reason), (source, letters[source])
        assert fragment in error, (source, error)
    assert stats["kept"] == case.kept
    assert stats["rejected"] == len(rejected) and stats["filtered"] == len(filtered)
    assert stats["records_read"] == case.kept + len(letters) + stats["duplicates"]
    assert stats["duplicates"] == 0
    assert (out / "manifest.json").exists()
    text = _kept_text(out, tiny_model_dir)
    for expected in case.kept_texts:
        assert expected in text
    for unexpected in case.absent_texts:
        assert unexpected not in text
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # .temp-*, .shuffle-*
    left = {p.pid for p in psutil.Process().children(recursive=True)} - children
    assert not left, left


def test_a_large_gzip_file_named_jsonl_is_not_cut_into_ranges(tmp_path: Path):
    """Uncompressed JSONL files over SPLIT_BYTES are read in byte ranges; a compressed stream
    under a plain name must be read whole (a range of a gzip stream is garbage)."""
    from apache_beam.io.filesystems import FileSystems

    from beam_preprocess.readers import WHOLE_FILE, PlanRanges

    plain = tmp_path / "plain.jsonl"
    plain.write_text(_jsonl(instruction_rows(200, "plan")))
    packed = tmp_path / "packed.jsonl"
    packed.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=0))
    plan = PlanRanges("auto", split_bytes=1000)
    for path, whole in ((plain, False), (packed, True)):
        (metadata,) = FileSystems.match([str(path)])[0].metadata_list
        ranges = list(plan.process(metadata))
        assert (ranges == [(str(path), 0, WHOLE_FILE, 1)]) is whole, ranges
        assert whole or len(ranges) > 1
