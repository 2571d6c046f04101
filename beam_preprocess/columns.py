"""Tokenized examples as columns: the element Tokenize emits and the packing step groups.

One element holds the kept examples of one tokenizer batch, hash bucket and split. Beam's cost is
per element and per Python object in it, and the local runner holds the whole shuffle in memory
(decoded, then encoded again: docs/performance.md), so an example costs no Python object of its
own here and about 2.1 bytes per token (it was ten objects and 5 bytes per token as per-example
tuples of int32 ids and uint8 masks).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from beam_preprocess.packing import Document
from beam_preprocess.record_steps import HASH_CHARS, source_order

TokenizedColumns = tuple[str, str, tuple[Any, ...], tuple[Any, ...], list[int], list[Any]]
"""The tokenized examples of one batch, bucket and split, as columns (one shuffle element):

    (split, content hashes (concatenated, HASH_CHARS each),
     sources (paths, path index per example (int32), line per example (int64, -1: the path is
              the whole source)),
     documents (documents per example (int32), document lengths (int32), the ids' dtype,
                all token ids, all loss masks as bits (numpy packbits)),
     indices of the retokenized examples,
     eval records (record_of, one per example in the eval split; else empty))

Token ids travel as uint16 when every id of the element fits (vocabularies up to 65,536), else
int32, and masks as bits. Plain tuples, lists, bytes and strings: Beam's default coder encodes
those natively (a class would be pickled)."""


class ColumnsBuilder:
    """Collects one split's kept examples of a batch and bucket into TokenizedColumns."""

    def __init__(self, split: str) -> None:
        self.split = split
        self.hashes: list[str] = []
        self.paths: dict[str, int] = {}
        self.path_index: list[int] = []
        self.lines: list[int] = []
        self.doc_counts: list[int] = []
        self.ids: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.retokenized: list[int] = []
        self.records: list[Any] = []
        self.tokens = 0

    def add(self, content: str, source: str, result: Any, record: Any) -> None:
        if len(content) != HASH_CHARS:
            raise ValueError(f"content hash {content!r} is not {HASH_CHARS} characters")
        if result.retokenized:
            self.retokenized.append(len(self.hashes))
        self.hashes.append(content)
        path, number = source_order(source)
        if f"{path}:{number}" != source:  # kept whole when "path:line" would not restore it
            path, number = source, -1
        self.path_index.append(self.paths.setdefault(path, len(self.paths)))
        self.lines.append(number)
        self.doc_counts.append(len(result.docs))
        for ids, mask in result.docs:
            self.ids.append(ids)
            self.masks.append(mask)
            self.tokens += len(ids)
        if record is not None:
            self.records.append(record)

    def columns(self) -> TokenizedColumns:
        lengths = np.fromiter(map(len, self.ids), dtype=np.int32, count=len(self.ids))
        ids = np.concatenate(self.ids)
        dtype = np.uint16 if ids.size and ids.min() >= 0 and ids.max() <= 0xFFFF else np.int32
        sources = (
            list(self.paths),
            np.asarray(self.path_index, dtype=np.int32).tobytes(),
            np.asarray(self.lines, dtype=np.int64).tobytes(),
        )
        documents = (
            np.asarray(self.doc_counts, dtype=np.int32).tobytes(),
            lengths.tobytes(),
            np.dtype(dtype).name,
            ids.astype(dtype, copy=False).tobytes(),
            np.packbits(np.concatenate(self.masks)).tobytes(),
        )
        return self.split, "".join(self.hashes), sources, documents, self.retokenized, self.records


def hashes_and_sources(columns: TokenizedColumns) -> Iterator[tuple[str, str]]:
    """(content hash, source) of each example in TokenizedColumns."""
    _, hashes, (paths, path_index, lines), *_ = columns
    index = np.frombuffer(path_index, dtype=np.int32).tolist()
    numbers = np.frombuffer(lines, dtype=np.int64).tolist()
    for i, (p, n) in enumerate(zip(index, numbers, strict=True)):
        source = paths[p] if n < 0 else f"{paths[p]}:{n}"
        yield hashes[i * HASH_CHARS : (i + 1) * HASH_CHARS], source


def tokenized_examples(
    columns: TokenizedColumns,
) -> Iterator[tuple[str, str, list[Document], bool, Any]]:
    """TokenizedColumns -> (hash, source, documents, retokenized, eval record or None) per example;
    the documents are views into one int32 array of ids and one uint8 array of masks."""
    doc_counts, lengths, dtype, ids, masks = columns[3]
    retokenized, records = set(columns[4]), columns[5]
    ends = np.cumsum(np.frombuffer(lengths, dtype=np.int32)).tolist()
    all_ids = np.frombuffer(ids, dtype=dtype).astype(np.int32, copy=False)
    all_masks = np.unpackbits(np.frombuffer(masks, dtype=np.uint8), count=ends[-1] if ends else 0)
    counts = np.frombuffer(doc_counts, dtype=np.int32).tolist()
    doc = start = 0
    for i, (count, (content, source)) in enumerate(
        zip(counts, hashes_and_sources(columns), strict=True)
    ):
        docs = []
        for end in ends[doc : doc + count]:
            docs.append((all_ids[start:end], all_masks[start:end]))
            start = end
        doc += count
        yield content, source, docs, i in retokenized, records[i] if records else None
