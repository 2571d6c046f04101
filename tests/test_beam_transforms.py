"""Each preprocessing transform on its own, with TestPipeline + assert_that."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_preprocess.columns import tokenized_examples
from beam_preprocess.options import PreprocessConfig
from beam_preprocess.packing import pack_exact, pack_offline, pack_streaming, rows_from_bins
from beam_preprocess.readers import ReadRecords
from beam_preprocess.record_steps import Prepare, split_of
from beam_preprocess.records import DEAD, EVAL_RECORDS, FILTERED, OUTCOME, READ, STATS
from beam_preprocess.token_steps import (
    TABLES,
    TAIL_TABLES,
    DeduplicateAndPack,
    Tokenize,
)


def _pipeline() -> BeamTestPipeline:
    # FnApiRunner is the DirectRunner's batch engine; naming it skips the Prism download attempt.
    return BeamTestPipeline(runner="FnApiRunner")


def _config(**overrides) -> PreprocessConfig:
    base = {"inputs": ("x",), "output": "/tmp/unused", "tokenizer": "unused", "seq_len": 64}
    return PreprocessConfig(**{**base, **overrides})


@pytest.mark.integration  # a Beam pipeline run
def test_read_records_all_formats(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl").write_text(
        '{"prompt": "p1", "response": "r1"}\n\n{"prompt": "p2"\n[1]\n'
    )
    (tmp_path / "b.json").write_text(json.dumps([{"prompt": "p3", "response": "r3"}]))
    (tmp_path / "c.csv").write_text('prompt,response\np4,r4\n"p5","r5",extra\n')
    pq.write_table(
        pa.Table.from_pylist([{"prompt": "p6", "response": "r6"}]), tmp_path / "d.parquet"
    )
    d = str(tmp_path)
    with _pipeline() as p:
        out = p | ReadRecords([f"{d}/*.jsonl", f"{d}/*.json", f"{d}/*.csv", f"{d}/*.parquet"])
        assert_that(
            out.records
            | beam.Map(lambda r: (r["source"].rsplit("/", 1)[1], r["record"]["prompt"])),
            equal_to(
                [("a.jsonl:1", "p1"), ("b.json[0]", "p3"), ("c.csv:2", "p4"), ("d.parquet#0", "p6")]
            ),
            label="records",
        )
        assert_that(
            out[DEAD] | beam.Map(lambda r: (r["source"].rsplit("/", 1)[1], r["reason"])),
            equal_to(
                [
                    ("a.jsonl:3", "invalid_json"),
                    ("a.jsonl:4", "not_an_object"),
                    ("c.csv:3", "invalid_csv"),
                ]
            ),
            label="dead",
        )
        # Blank lines are not records; every other line is counted as read.
        assert_that(out[READ] | beam.CombineGlobally(sum), equal_to([7]), label="read")
        assert_that(
            out[OUTCOME],
            equal_to(
                [
                    ("rejected/invalid_json", 1),
                    ("rejected/not_an_object", 1),
                    ("rejected/invalid_csv", 1),
                ]
            ),
            label="outcome",
        )


@pytest.mark.integration  # a Beam pipeline run
def test_prepare_rejects_bad_records_with_reasons():
    records = [
        {"source": "f:1", "record": {"prompt": "P", "response": "R"}},
        {"source": "f:2", "record": {"prompt": "P"}},
        {"source": "f:3", "record": {"prompt": "P", "response": "  "}},
        {"source": "f:4", "record": {"prompt": 3, "response": "R"}},
        {
            "source": "f:5",
            "record": {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                ]
            },
        },
        {"source": "f:6", "record": {"messages": [{"role": "user", "content": "hi"}]}},
    ]
    with _pipeline() as p:
        out = p | beam.Create(records) | Prepare(_config())
        assert_that(
            out.examples | beam.Map(lambda e: (e["source"], e["messages"][-1]["content"])),
            equal_to([("f:1", "R"), ("f:5", "yo")]),
            label="ok",
        )
        assert_that(
            out[DEAD] | beam.Map(lambda d: (d["source"], d["reason"])),
            equal_to(
                [
                    ("f:2", "missing_field"),
                    ("f:3", "empty_field"),
                    ("f:4", "invalid_field_type"),
                    ("f:6", "invalid_messages"),
                ]
            ),
            label="dead",
        )


@pytest.mark.integration  # a Beam pipeline run
def test_prepare_cleans_and_filters_by_characters():
    records = [
        {"source": "a", "record": {"text": "  Cafe\u0301\r\nok\x07  "}},
        {"source": "b", "record": {"text": "x" * 50}},
    ]
    with _pipeline() as p:
        out = p | beam.Create(records) | Prepare(_config(data_kind="text", max_chars=20))
        assert_that(
            out.examples | beam.Map(lambda e: (e["text"], e["split"], len(e["hash"]))),
            equal_to([("Caf\u00e9\nok", "train", 64)]),
            label="clean",
        )
        assert_that(
            out[FILTERED] | beam.Map(lambda d: (d["source"], d["reason"])),
            equal_to([("b", "too_long_chars")]),
            label="filtered",
        )
        assert_that(out[OUTCOME], equal_to([("filtered/too_long_chars", 1)]), label="outcome")


def _columns(examples: list[tuple[str, str, tuple[bytes, bytes], bool]]) -> tuple:
    """Train examples (hash, "path:line" source, (ids, mask) bytes, retokenized), one document
    each, as Tokenize emits them (token_steps.TokenizedColumns), written out by hand."""
    docs = [doc for _, _, doc, _ in examples]
    paths = sorted({source.split(":")[0] for _, source, _, _ in examples})
    sources = (
        paths,
        np.array([paths.index(s.split(":")[0]) for _, s, _, _ in examples], np.int32).tobytes(),
        np.array([int(s.split(":")[1]) for _, s, _, _ in examples], np.int64).tobytes(),
    )
    documents = (
        np.ones(len(examples), np.int32).tobytes(),
        np.array([len(ids) // 4 for ids, _ in docs], np.int32).tobytes(),
        "int32",
        b"".join(ids for ids, _ in docs),
        np.packbits(np.frombuffer(b"".join(mask for _, mask in docs), np.uint8)).tobytes(),
    )
    hashes = "".join(content.rjust(64, "0") for content, *_ in examples)
    retokenized = [i for i, example in enumerate(examples) if example[3]]
    return "train", hashes, sources, documents, retokenized, []


@pytest.mark.integration  # a Beam pipeline run
def test_deduplicate_keeps_lowest_source_once():
    from beam_preprocess.records import RETOKENIZED

    doc = (np.arange(8, dtype=np.int32).tobytes(), np.array([0] + [1] * 7, np.uint8).tobytes())
    other = (np.arange(5, dtype=np.int32).tobytes(), np.array([0, 1, 1, 1, 1], np.uint8).tobytes())
    # RETOKENIZED names the source of each kept copy; "f:9" is listed twice (one input matched
    # by two patterns) and still kept once.
    items = [("h1", source, doc, True) for source in ("f:10", "f:9", "f:9", "f:11")]
    items.append(("h2", "f:1", other, True))
    keyed = [(0, _columns(items[:2])), (0, _columns(items[2:]))]
    with _pipeline() as p:
        out = p | beam.Create(keyed) | DeduplicateAndPack(16, 0, max_open_rows=4)
        assert_that(out[RETOKENIZED], equal_to(["f:9", "f:1"]), label="kept")
        assert_that(
            out[OUTCOME] | beam.CombinePerKey(sum),
            equal_to([("kept", 2), ("duplicate", 3)]),
            label="outcomes",
        )
        assert_that(
            out[STATS] | beam.Map(lambda s: s[1][1]) | beam.CombineGlobally(sum),
            equal_to([2]),
            label="documents",
        )


@pytest.mark.integration  # a Beam pipeline run
def test_split_is_deterministic_by_prompt():
    examples = [
        {
            "source": str(i),
            "messages": [
                {"role": "user", "content": f"q{i % 500}"},
                {"role": "assistant", "content": str(i)},
            ],
        }
        for i in range(2000)
    ]
    expected = [(e["source"], split_of(e, 0.2, "s")) for e in examples]
    records = [
        {"source": e["source"], "record": {"prompt": f"q{i % 500}", "response": str(i)}}
        for i, e in enumerate(examples)
    ]
    with _pipeline() as p:
        out = p | beam.Create(records) | Prepare(_config(eval_fraction=0.2, split_seed="s"))
        assert_that(
            out.examples | beam.Map(lambda e: (e["source"], e["split"])), equal_to(expected)
        )
    by_prompt: dict[str, set[str]] = {}
    for e, (_, split) in zip(examples, expected, strict=True):
        by_prompt.setdefault(e["messages"][0]["content"], set()).add(split)
    assert all(len(s) == 1 for s in by_prompt.values())  # one prompt, one side of the split
    eval_share = sum(s == {"eval"} for s in by_prompt.values()) / len(by_prompt)
    assert 0.14 < eval_share < 0.26


@pytest.mark.integration  # a Beam pipeline run
def test_tokenize_masks_exactly_the_response(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    pairs = [
        ("What is 2 + 2?", "4"),
        ("Sort ascending: 3 1 2", "1 2 3"),
        ("Reverse the word: abc", "cba"),
    ]
    examples = [
        {
            "source": f"f:{i}",
            "hash": f"{i:064x}",
            "split": "eval" if i == 0 else "train",
            "messages": [{"role": "user", "content": p}, {"role": "assistant", "content": r}],
        }
        for i, (p, r) in enumerate(pairs)
    ]
    examples.append(
        {
            **examples[1],
            "source": "long",
            "messages": [
                {"role": "user", "content": "word " * 200},
                {"role": "assistant", "content": "x"},
            ],
        }
    )
    expected = []
    for p, r in pairs:
        user = [{"role": "user", "content": p}]
        prompt = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template([*user, {"role": "assistant", "content": r}], tokenize=False)
        prompt_ids = tok(prompt, add_special_tokens=False).input_ids
        full_ids = tok(full, add_special_tokens=False).input_ids
        assert full_ids[: len(prompt_ids)] == prompt_ids and full_ids[-1] == tok.eos_token_id
        mask = [0] * len(prompt_ids) + [1] * (len(full_ids) - len(prompt_ids))
        expected.append((full_ids, mask))
    config = _config(tokenizer=str(tiny_model_dir), seq_len=64, pack_groups=1)
    with _pipeline() as p:
        out = p | beam.Create(examples) | Tokenize(config)
        assert_that(out.documents | beam.FlatMap(_documents_of), equal_to(expected), label="docs")
        assert_that(
            out[FILTERED] | beam.Map(lambda d: (d["source"], d["reason"])),
            equal_to([("long", "too_long_tokens")]),
            label="filtered",
        )
        packed = out.documents | DeduplicateAndPack(64, 0, max_open_rows=8)
        assert_that(
            packed[EVAL_RECORDS],
            equal_to([{"prompt": pairs[0][0], "response": pairs[0][1]}]),
            label="eval",
        )
        assert_that(
            (out[OUTCOME], packed[OUTCOME]) | beam.Flatten() | beam.CombinePerKey(sum),
            equal_to([("kept", 3), ("filtered/too_long_tokens", 1)]),
            label="outcome",
        )


def _documents_of(keyed: tuple[int, tuple]) -> list[tuple[list[int], list[int]]]:
    """Tokenize's (bucket, TokenizedColumns) -> the documents as (ids, mask) lists."""
    return [
        (ids.tolist(), mask.tolist())
        for _, _, docs, _, _ in tokenized_examples(keyed[1])
        for ids, mask in docs
    ]


def _random_docs(n: int, seq_len: int, seed: int = 0) -> list[tuple[bytes, bytes]]:
    rng = np.random.default_rng(seed)
    docs = []
    next_id = 0
    for _ in range(n):
        length = (
            int(rng.integers(2, seq_len + 1))
            if rng.random() < 0.3
            else int(rng.integers(2, seq_len // 4))
        )
        ids = np.arange(
            next_id, next_id + length, dtype=np.int32
        )  # unique ids: loss/dup detectable
        next_id += length
        mask = (rng.random(length) < 0.7).astype(np.uint8)
        mask[0] = 0
        docs.append((ids.tobytes(), mask.tobytes()))
    return docs


def _check_rows(tables, docs, seq_len: int, pad_id: int) -> None:
    import pyarrow as pa

    table = pa.concat_tables([t for _, t in tables])
    ids = np.array(table.column("input_ids").to_pylist())
    mask = np.array(table.column("loss_mask").to_pylist())
    pos = np.array(table.column("position_ids").to_pylist())
    assert ids.shape[1] == seq_len and mask.shape == pos.shape == ids.shape
    # Cut every row into segments at position 0 and rebuild the documents.
    found = []
    for row_ids, row_mask, row_pos in zip(ids, mask, pos, strict=True):
        starts = [*list(np.flatnonzero(row_pos == 0)), seq_len]
        for s, e in itertools.pairwise(starts):
            assert (row_pos[s:e] == np.arange(e - s)).all()
            assert row_mask[s] == 0
            if row_ids[s] == pad_id and (row_ids[s:e] == pad_id).all() and e == seq_len:
                assert not row_mask[s:e].any()
                continue
            found.append(
                (row_ids[s:e].astype(np.int32).tobytes(), row_mask[s:e].astype(np.uint8).tobytes())
            )
    # Every document appears exactly once, whole (no token lost, duplicated or split).
    assert sorted(found) == sorted(docs)


@pytest.mark.integration  # a Beam pipeline run
def test_pack_invariants_and_fill():
    seq_len, pad_id = 128, -1
    docs = _random_docs(1500, seq_len)
    # Tokenize's shape: (bucket, columns) per batch and bucket.
    items = [(f"h{i}", f"f:{i}", doc, False) for i, doc in enumerate(docs)]
    keyed = [
        (k, _columns(items[start + k : start + 40 : 4]))
        for start in range(0, len(items), 40)
        for k in range(4)
    ]
    with _pipeline() as p:
        out = p | beam.Create(keyed) | DeduplicateAndPack(seq_len, pad_id, max_open_rows=256)
        assert_that(
            (out[TABLES], out[TAIL_TABLES]) | beam.Flatten() | beam.combiners.ToList(),
            lambda all_tables: [_check_rows(all_tables[0], docs, seq_len, pad_id)],
            label="rows",
        )
        tokens = sum(len(d[0]) // 4 for d in docs)

        def check_stats(stats):
            rows = sum(s[1][0] for s in stats)
            assert sum(s[1][1] for s in stats) == len(docs)
            assert sum(s[1][2] for s in stats) == tokens
            assert tokens / (rows * seq_len) >= 0.98, tokens / (rows * seq_len)

        assert_that(out[STATS], check_stats, label="stats")


def test_packers_never_split_and_position_ids_restart():
    rng = np.random.default_rng(1)
    docs = [(np.full(n, 7, np.int32), np.ones(n, np.uint8)) for n in rng.integers(1, 33, 500)]
    for bins in (
        list(pack_streaming(docs, 32, max_open_bins=8)),
        pack_offline(docs, 32),
        pack_exact(docs, 32),
    ):
        assert sum(len(b) for b in bins) == len(docs)
        assert all(sum(len(d[0]) for d in b) <= 32 for b in bins)
        rows = rows_from_bins(bins, 32, pad_id=0)
        assert rows.input_ids.shape == (len(bins), 32)
        assert rows.tokens == sum(len(d[0]) for d in docs)
        assert (rows.loss_mask[:, 0] == 0).all() and (rows.position_ids[:, 0] == 0).all()


def test_chat_fast_path_only_when_it_matches_jinja(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    from beam_preprocess.chat_template import ChatRenderer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    renderer = ChatRenderer(tok)
    assert renderer._pattern is not None  # the quickstart template is a plain pattern
    # A template that transforms content (trim) must fall back to Jinja for every record.
    tok.chat_template = tok.chat_template.replace(
        "message['content'] }}", "message['content'] | trim }}"
    )
    renderer = ChatRenderer(tok)
    assert renderer._pattern is None
    text, spans = renderer.pair("  padded  ", " 42 ")
    assert text == "<|user|>padded<|end|><|assistant|>42<|end|>"
    assert text[spans[0][0] : spans[0][1]] == "42<|end|>"


@pytest.mark.integration  # a Beam pipeline run
def test_tokenize_plain_text_appends_eos_and_splits_overlong(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "Sort ascending: 3 1 2 " * 8
    ids = [*tok(text).input_ids, tok.eos_token_id]
    assert len(ids) > 32
    short = "Reverse the word: abc"
    short_ids = [*tok(short).input_ids, tok.eos_token_id]
    # Both in one bucket (pack_groups=1): the columns must keep each example's documents apart.
    examples = [
        {"source": "t:1", "hash": "0" * 64, "split": "train", "text": text},
        {"source": "t:2", "hash": "1" * 64, "split": "train", "text": short},
    ]
    config = _config(
        tokenizer=str(tiny_model_dir), seq_len=32, data_kind="text", overlong="split", pack_groups=1
    )
    expected = [(short_ids, [0] + [1] * (len(short_ids) - 1))]
    for start in range(0, len(ids), 32):
        chunk = ids[start : start + 32]
        if len(chunk) > 1:
            expected.append((chunk, [0] + [1] * (len(chunk) - 1)))
    with _pipeline() as p:
        out = p | beam.Create(examples) | Tokenize(config)
        assert_that(out.documents | beam.FlatMap(_documents_of), equal_to(expected))


@pytest.mark.integration  # a Beam pipeline run
def test_jsonl_read_in_ranges_keeps_exact_line_numbers(tmp_path: Path):
    from beam_preprocess.readers import WHOLE_FILE, line_ranges

    lines = []
    for i in range(1, 41):
        if i % 7 == 0:
            lines.append("")  # blank: not a record, but it still counts as a line
        elif i % 11 == 0:
            lines.append('{"prompt": broken')
        else:
            lines.append(json.dumps({"prompt": f"p{i}" * (i % 5 + 1), "response": "r"}))
    data = ("\n".join(lines) + "\n").encode()
    path = tmp_path / "big.jsonl"
    path.write_bytes(data)

    ranges = list(line_ranges(io.BytesIO(data), "big.jsonl", split_bytes=100))
    assert len(ranges) > 5
    ends = [end if end != WHOLE_FILE else len(data) for _, _, end, _ in ranges]
    assert [start for _, start, _, _ in ranges] == [0, *ends[:-1]]  # contiguous, nothing lost
    for _, start, _, first_line in ranges:
        assert start == 0 or data[start - 1 : start] == b"\n"
        assert first_line == data[:start].count(b"\n") + 1

    def check_read(split_bytes: int) -> None:
        with _pipeline() as p:
            out = p | ReadRecords([str(path)], split_bytes=split_bytes)
            records = out.records | "R" >> beam.Map(lambda r: r["source"].rsplit(":", 1)[1])
            dead = out[DEAD] | "D" >> beam.Map(lambda r: r["source"].rsplit(":", 1)[1])
            expected_records = [str(i) for i in range(1, 41) if i % 7 and i % 11]
            assert_that(records, equal_to(expected_records), label="records")
            assert_that(dead, equal_to(["11", "22", "33"]), label="dead")
            total = out[READ] | beam.CombineGlobally(sum)
            assert_that(total, equal_to([len(expected_records) + 3]), label="read")

    check_read(split_bytes=100)  # many ranges
    check_read(split_bytes=1 << 30)  # one whole-file range


TRAILING_SPACE_TEMPLATE = (
    "{% for message in messages %}### {{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}### assistant: {% endif %}"
)
"""A generation prompt ending in a space: byte-level BPE merges it into the answer's first word."""


def trailing_space_tokenizer(tiny_model_dir: Path, out: Path) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = TRAILING_SPACE_TEMPLATE
    tok.save_pretrained(out)
    return out


def _encoder(tokenizer_dir: Path):
    from beam_preprocess.tokenize import (
        DocumentEncoder,
        EncoderConfig,
        TokenizerSpec,
        load_tokenizer,
    )

    spec = TokenizerSpec.of(load_tokenizer(str(tokenizer_dir)), str(tokenizer_dir))
    return DocumentEncoder(spec, EncoderConfig(data_kind="chat", seq_len=256, overlong="drop"))


def _pair(prompt: str, answer: str) -> dict:
    return {
        "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    }


def test_answer_first_token_is_a_target_when_the_prompt_ends_in_a_space(
    tiny_model_dir: Path, tmp_path: Path
):
    from transformers import AutoTokenizer

    tokenizer_dir = trailing_space_tokenizer(tiny_model_dir, tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    pairs = [("What is the capital?", "the city"), ("Add 2 and 2", "4"), ("Hi", "Paris")]
    results = _encoder(tokenizer_dir).encode([_pair(p, a) for p, a in pairs])
    for (prompt, answer), result in zip(pairs, results, strict=True):
        assert result.outcome == "kept"
        ((ids, mask),) = result.docs
        head = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tok(head, add_special_tokens=False).input_ids
        # The prompt is exactly what inference feeds, every token after it is a target, and the
        # targets decode to the whole answer (its first characters included).
        assert ids[: len(prompt_ids)].tolist() == prompt_ids
        assert mask.tolist() == [0] * len(prompt_ids) + [1] * (len(ids) - len(prompt_ids))
        assert tok.decode(ids[len(prompt_ids) :].tolist()) == answer + "\n"
    # Where the joint tokenization merged the space into the answer's first word (" the", " 4"),
    # the document was re-encoded; " Paris" has no merge with the space in this vocabulary.
    assert [r.retokenized for r in results] == [True, True, False]


def test_answer_boundary_refused_when_the_tokenizer_alters_pieces(tmp_path: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    backend.decoder = decoders.Metaspace(prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"])
    backend.train_from_iterator(
        ["### user: hello world\n### assistant: Paris is nice\n"] * 5, trainer
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")
    tok.chat_template = TRAILING_SPACE_TEMPLATE
    tok.save_pretrained(tmp_path / "sp")
    (result,) = _encoder(tmp_path / "sp").encode([_pair("hello world", "Paris is nice")])
    assert (result.outcome, result.reason) == ("rejected", "answer_boundary")
    assert "generation prompt ends in" in result.error and "no trailing space" in result.error


@pytest.mark.integration  # a Beam pipeline run
def test_tokenize_reports_retokenized_sources(tiny_model_dir: Path, tmp_path: Path):
    from beam_preprocess.records import RETOKENIZED

    tokenizer_dir = trailing_space_tokenizer(tiny_model_dir, tmp_path / "tok")
    examples = [
        {**_pair(p, a), "source": f"f:{i}", "hash": f"{i:064x}", "split": "train"}
        for i, (p, a) in enumerate([("Add 2 and 2", "4"), ("Name a city", "Paris")])
    ]
    config = _config(tokenizer=str(tokenizer_dir), seq_len=64, pack_groups=1)
    with _pipeline() as p:
        tokens = p | beam.Create(examples) | Tokenize(config)
        out = tokens.documents | DeduplicateAndPack(64, 0, max_open_rows=8)
        assert_that(out[RETOKENIZED], equal_to(["f:0"]))


def test_bundle_file_writes_tables_in_order_and_reports_a_failed_write(tmp_path: Path):
    """Parquet tables are written in a background thread (sinks._BundleFile): order is kept, and
    a table the writer refuses fails the bundle at close instead of vanishing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_preprocess.sinks import PARQUET, Shards, _BundleFile

    schema = pa.schema([("n", pa.int32())])
    shards = Shards(str(tmp_path / "part"), PARQUET)
    good = _BundleFile(str(tmp_path / "good.parquet"), shards, schema)
    for start in range(0, 30, 10):
        good.write(pa.table({"n": pa.array(range(start, start + 10), pa.int32())}))
    good.close()
    assert pq.read_table(tmp_path / "good.parquet")["n"].to_pylist() == list(range(30))

    bad = _BundleFile(str(tmp_path / "bad.parquet"), shards, schema)
    bad.write(pa.table({"other": pa.array(["x"])}))
    with pytest.raises(ValueError, match="schema"):
        bad.close()


@pytest.mark.parametrize("largest_id", [65_535, 65_536])
def test_tokenized_columns_round_trip_ids_masks_and_flags(largest_id: int):
    from beam_preprocess.columns import ColumnsBuilder
    from beam_preprocess.tokenize import Encoded

    rng = np.random.default_rng(0)

    def doc(n: int) -> tuple[np.ndarray, np.ndarray]:
        ids = rng.integers(0, largest_id + 1, n).astype(np.int32)
        ids[0] = largest_id
        return ids, (rng.random(n) < 0.5).astype(np.uint8)

    # Sources that "path:line" would not restore are kept whole.
    sources = ["f:0", "gs://b/x.jsonl:12", "f:007", "no-line", "a:b:3", ":4", "f:1"]
    examples = [
        (f"{i:064x}", source, Encoded(docs=[doc(13), doc(3)] if i % 2 else [doc(9)]), {"i": i})
        for i, source in enumerate(sources)
    ]
    examples[1][2].retokenized = True
    builder = ColumnsBuilder("eval")
    for content, source, result, record in examples:
        builder.add(content, source, result, record)
    columns = builder.columns()
    assert columns[3][2] == ("uint16" if largest_id < 65_536 else "int32")
    decoded = list(tokenized_examples(columns))
    assert [(c, s, r, rec) for c, s, _, r, rec in decoded] == [
        (content, source, i == 1, {"i": i}) for i, (content, source, _, _) in enumerate(examples)
    ]
    for (_, _, result, _), (*_, docs, _, _) in zip(examples, decoded, strict=True):
        assert [(i.tolist(), m.tolist()) for i, m in docs] == [
            (i.tolist(), m.tolist()) for i, m in result.docs
        ]


@pytest.mark.integration  # a Beam pipeline run
def test_spilled_shuffle_packs_the_same_rows_as_the_in_memory_one(
    tiny_model_dir: Path, tmp_path: Path
):
    """Local runs shuffle file paths instead of columns (beam_preprocess.spill): the same
    examples, duplicates and eval records come out, packed into the same rows."""
    from beam_preprocess.record_steps import content_hash
    from beam_preprocess.records import RETOKENIZED

    examples = []
    for i in range(300):
        k = i % 240  # the last 60 examples repeat earlier ones
        example = _pair(f"Question {k} " + "word " * (k % 37), f"Answer {k}")
        split = "eval" if k < 24 else "train"
        examples.append({**example, "source": f"f:{i}", "split": split})
        examples[-1]["hash"] = content_hash(examples[-1])
    config = _config(
        tokenizer=str(tiny_model_dir), seq_len=64, pack_groups=4, tokenize_batch_size=32
    )
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()

    def rows(tables: list) -> list[str]:
        return sorted(json.dumps([split, row]) for split, t in tables for row in t.to_pylist())

    def same(memory: list, spilled: list) -> bool:
        return sorted(map(json.dumps, memory)) == sorted(map(json.dumps, spilled))

    with _pipeline() as p:
        created = p | beam.Create(examples)
        outputs: dict[str, dict[str, Any]] = {}
        for name, directory in (("memory", None), ("spill", str(spill_dir))):
            tokens = created | f"Tokenize-{name}" >> Tokenize(config, spill_dir=directory)
            packed = tokens.documents | f"Pack-{name}" >> DeduplicateAndPack(64, 0, 8)
            parts = {
                "tables": (packed[TABLES], packed[TAIL_TABLES])
                | f"Tables-{name}" >> beam.Flatten(),
                "eval": packed[EVAL_RECORDS],
                "outcome": packed[OUTCOME],
                "retokenized": packed[RETOKENIZED],
            }
            outputs[name] = {
                part: pcoll | f"List-{part}-{name}" >> beam.combiners.ToList()
                for part, pcoll in parts.items()
            }
            outputs[name]["elements"] = tokens.documents | f"Types-{name}" >> beam.Map(
                lambda keyed: type(keyed[1]).__name__
            )
        outputs["memory"]["tables"] |= "Rows-memory" >> beam.Map(rows)
        outputs["spill"]["tables"] |= "Rows-spill" >> beam.Map(rows)
        for part in ("tables", "eval", "outcome", "retokenized"):
            spilled = beam.pvalue.AsSingleton(outputs["spill"][part])
            check = outputs["memory"][part] | f"Same-{part}" >> beam.Map(same, spilled)
            assert_that(check, equal_to([True]), label=f"same-{part}")
        elements = outputs["spill"]["elements"] | beam.Distinct()
        assert_that(elements, equal_to(["str"]), label="paths")
        assert_that(
            outputs["memory"]["outcome"] | beam.FlatMap(list) | beam.CombinePerKey(sum),
            equal_to([("kept", 240), ("duplicate", 60)]),
            label="kept",
        )


def test_spilled_files_round_trip_and_a_cut_file_fails(tmp_path: Path):
    from beam_preprocess.spill import BucketColumns, SpillWriter, read_spilled

    doc = (np.arange(8, dtype=np.int32).tobytes(), np.ones(8, np.uint8).tobytes())
    elements = [_columns([(f"h{i}", f"f:{i}", doc, i == 1)]) for i in range(3)]
    writer = SpillWriter(str(tmp_path))
    for bucket, columns in ((1, elements[0]), (0, elements[1]), (1, elements[2])):
        writer.write(bucket, columns)
    (bucket1, path1), (bucket0, path0) = writer.close()  # in the order of first writes
    assert (bucket1, bucket0) == (1, 0)
    assert list(read_spilled(path1)) == [elements[0], elements[2]]
    # Twice over, as the packing step reads a bucket; columns already in the shuffle pass through.
    group = BucketColumns([path1, elements[1]])
    assert list(group) == list(group) == [elements[0], elements[2], elements[1]]
    cut = tmp_path / "cut"
    cut.write_bytes(Path(path0).read_bytes()[:-3])
    with pytest.raises(OSError, match="ends inside an element"):
        list(read_spilled(str(cut)))
