"""Turning clean examples into token documents with loss masks (no Beam here; the DoFn wraps it).

Instruction data is rendered with the tokenizer's own chat template, exactly as the trainer and
evaluator will see it at inference time: the prompt is `apply_chat_template(history,
add_generation_prompt=True)` and the target is what the full conversation adds after it (the
assistant content and its end-of-turn/eos token). The loss mask is computed from character spans of
the rendered text mapped to tokens, so one tokenization of the full text is usually enough.

Prompt/answer boundary: when a generation prompt ends in text the answer continues (typically a
trailing space: "Assistant: " + "Paris" tokenizes as "Assistant:" + " Paris"), one token spans the
boundary. Counting it as prompt would drop the answer's first token from the targets, and counting
it as target would train on prompts that end before the space, while inference feeds the prompt
with it. Such documents are re-encoded piecewise instead (prompt, answer and what follows each
encoded on their own and concatenated), so the answer's first token is a target and the prompt
tokens are exactly those `tokenizer(prompt)` gives at inference. The re-encoding must decode to
the same text; a tokenizer that alters text encoded on its own (a SentencePiece-style added
leading space) fails that check and the record is rejected with reason "answer_boundary", saying
which template change fixes it. Re-encoded documents are counted in the manifest's stats
("answer_boundary_retokenized", with the first sources).

Overlong documents (more tokens than seq_len), policy `--overlong`:
    drop      filter the record with reason "too_long_tokens" (default for instruction data: a
              truncated answer teaches the model to stop mid-sentence)
    truncate  keep the first seq_len tokens
    split     cut into seq_len chunks, each a document of its own (default for plain text, as
              run_clm.py does)
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from beam_preprocess.chat_template import ChatRenderer, Span, TemplateError
from beam_preprocess.packing import Document
from beam_preprocess.template_library import resolve_template
from trainer import storage

OVERLONG_POLICIES = ("drop", "truncate", "split")


def load_tokenizer(name_or_path: str, chat_template: str = "") -> Any:
    """A fast Hugging Face tokenizer from a local dir, a hub name, or a gs:// (any fsspec) dir;
    `chat_template` (a name or Jinja, beam_preprocess.template_library) replaces its own."""
    name_or_path = _local_dir(name_or_path)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except OSError as exc:
        raise ValueError(
            f"cannot load a tokenizer from {name_or_path!r} ({exc}): pass a directory written by "
            "save_pretrained (tokenizer.json + tokenizer_config.json) or a hub name"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"tokenizer {name_or_path!r} has no fast (Rust) implementation")
    if template := resolve_template(chat_template):
        tokenizer.chat_template = template
    return tokenizer


def pad_id_of(tokenizer: Any) -> int:
    """The id written in padding positions (pad, else eos, else 0: they are never targets)."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


@dataclass
class Encoded:
    """What became of one example: documents to pack, or why none."""

    docs: list[Document] = field(default_factory=list)
    outcome: str = "kept"
    """"kept", "filtered" or "rejected"."""
    reason: str = ""
    error: str = ""
    truncated: bool = False
    retokenized: bool = False
    """The prompt/answer boundary fell inside a token: re-encoded piecewise (module docstring)."""


@dataclass(frozen=True)
class TokenizerSpec:
    """What a worker needs to tokenize, computed once where the full tokenizer is loaded.

    Workers only need the Rust tokenizer and, for prompt/response pairs, the chat template's string
    pattern. Loading `AutoTokenizer` there imports transformers and torch: ~2.5 s of CPU per
    worker process on an idle core (over 10 s on a busy 2-core machine), more than tokenizing
    50k records. So workers read tokenizer.json with `tokenizers` directly when that file alone
    reproduces the backend (checked here), and load the full tokenizer only on first need:
    multi-turn conversations or templates that are not a plain pattern.
    """

    name_or_path: str
    eos_id: int | None
    chat_pattern: tuple[str, str, str] | None
    """(before prompt, between prompt and response, after response); None: render with Jinja."""
    backend_file_matches: bool
    """tokenizer.json loaded by `tokenizers` equals the backend transformers builds."""
    chat_template: str = ""
    """The `chat_template` option that replaces the tokenizer's own ("": none)."""

    @classmethod
    def of(
        cls,
        tokenizer: Any,
        name_or_path: str,
        chat_fast_path: bool = True,
        chat_template: str = "",
    ) -> TokenizerSpec:
        """`tokenizer` must be loaded with `chat_template` already (load_tokenizer)."""
        pattern = None
        if chat_fast_path and getattr(tokenizer, "chat_template", None):
            pattern = ChatRenderer(tokenizer)._pattern
        local = _tokenizer_file(name_or_path)
        matches = False
        if local is not None:
            from tokenizers import Tokenizer

            matches = Tokenizer.from_file(local).to_str() == tokenizer.backend_tokenizer.to_str()
        return cls(name_or_path, tokenizer.eos_token_id, pattern, matches, chat_template)

    def backend(self) -> Any:
        """The Rust tokenizer (without importing transformers when tokenizer.json suffices)."""
        local = _tokenizer_file(self.name_or_path) if self.backend_file_matches else None
        if local is None:
            return load_tokenizer(self.name_or_path).backend_tokenizer
        from tokenizers import Tokenizer

        return Tokenizer.from_file(local)


def _tokenizer_file(name_or_path: str) -> str | None:
    """tokenizer.json of a local or remote (copied locally) tokenizer directory, else None."""
    path = os.path.join(_local_dir(name_or_path), "tokenizer.json")
    return path if os.path.isfile(path) else None


def _local_dir(name_or_path: str) -> str:
    """A remote tokenizer directory copied to this worker's cache (once per node); local paths
    and hub names as they are."""
    return storage.cached_copy(name_or_path)


@dataclass
class EncoderConfig:
    data_kind: str
    seq_len: int
    overlong: str
    train_on_prompt: bool = False
    min_tokens: int = 2


TOKENIZER_CALLS = 2
"""Batches tokenized at once. The Rust tokenizer spreads one batch over every core, but its
threads idle at the end of each batch while the slowest text finishes; a second batch in flight
keeps them busy: 15-20% less wall time for the same tokens on 2 cores (docs/performance.md)."""


@dataclass
class PendingBatch:
    """A batch whose tokens are being computed (DocumentEncoder.start -> finish)."""

    results: list[Encoded]
    texts: list[str]
    spans: list[list[Span]]
    index: list[int]
    """Position in the batch of each text (examples that failed to render have none)."""
    encodings: Future


class DocumentEncoder:
    """Batched tokenization of examples into documents (ids + loss mask)."""

    def __init__(self, spec: TokenizerSpec, config: EncoderConfig) -> None:
        self.config = config
        self.spec = spec
        self.backend = spec.backend()
        if config.data_kind == "text" and spec.eos_id is None:
            raise ValueError("plain-text data needs a tokenizer with an eos token")
        self.eos = np.int32(spec.eos_id if spec.eos_id is not None else 0)
        self._renderer: ChatRenderer | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def renderer(self) -> ChatRenderer:
        """Jinja rendering with the full tokenizer, loaded on first need (see TokenizerSpec)."""
        if self._renderer is None:
            tokenizer = load_tokenizer(self.spec.name_or_path, self.spec.chat_template)
            self._renderer = ChatRenderer(tokenizer, fast_path=False)
        return self._renderer

    def _pattern_fits(self, messages: list[dict]) -> bool:
        return (
            self.spec.chat_pattern is not None
            and len(messages) == 2
            and messages[0]["role"] == "user"
            and messages[1]["role"] == "assistant"
        )

    def _render(
        self, messages: list[dict], renderer: ChatRenderer | None
    ) -> tuple[str, list[Span]]:
        if renderer is None:
            assert self.spec.chat_pattern is not None
            text, span = ChatRenderer.pattern_pair(
                self.spec.chat_pattern, messages[0]["content"], messages[1]["content"]
            )
            return text, [span]
        if len(messages) == 2 and messages[0]["role"] == "user":
            return renderer.pair(messages[0]["content"], messages[1]["content"])
        return renderer.conversation(messages)

    def encode(self, examples: Sequence[dict]) -> list[Encoded]:
        """Render, tokenize and mask a batch of examples (one result per example, in order)."""
        return self.finish(self.start(examples))

    def start(self, examples: Sequence[dict]) -> PendingBatch:
        """Render the batch and start the Rust tokenizer on it in a background thread.

        `encode_batch` releases the GIL, so the caller can prepare the next batch (or finish the
        previous one) while this one is tokenized: the Python steps then overlap the tokenizer
        instead of running while the cores it would use sit idle. finish() gives the results;
        up to TOKENIZER_CALLS started batches are tokenized at once.
        """
        results: list[Encoded] = [Encoded() for _ in examples]
        texts: list[str] = []
        spans: list[list[Span]] = []
        index: list[int] = []
        is_text = self.config.data_kind == "text"
        for i, example in enumerate(examples):
            if is_text:
                texts.append(example["text"])
                spans.append([])
                index.append(i)
                continue
            messages = example["messages"]
            # Loading the Jinja renderer stays outside the try: its failure is not a record's.
            renderer = None if self._pattern_fits(messages) else self.renderer
            try:
                text, target = self._render(messages, renderer)
            except TemplateError as exc:
                results[i] = Encoded(
                    outcome="rejected", reason="chat_template_error", error=str(exc)
                )
                continue
            except Exception as exc:  # Jinja raise_exception() in a template: a bad record
                results[i] = Encoded(
                    outcome="rejected",
                    reason="chat_template_error",
                    error=f"{type(exc).__name__}: {exc}",
                )
                continue
            texts.append(text)
            spans.append(target)
            index.append(i)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(TOKENIZER_CALLS, thread_name_prefix="tokenize")
        encodings = self._pool.submit(self.backend.encode_batch, texts, add_special_tokens=is_text)
        return PendingBatch(results, texts, spans, index, encodings)

    def finish(self, pending: PendingBatch) -> list[Encoded]:
        """Wait for the batch's tokens and compute its loss masks and length policy."""
        results, texts, spans, index = pending.results, pending.texts, pending.spans, pending.index
        encodings = pending.encodings.result()
        is_text = self.config.data_kind == "text"
        for i, enc, text, target in zip(index, encodings, texts, spans, strict=True):
            ids = np.asarray(enc.ids, dtype=np.int32)
            retokenized = False
            if is_text:
                ids = np.append(ids, self.eos)
                mask = np.ones(len(ids), dtype=np.uint8)
            elif self.config.train_on_prompt:
                mask = np.ones(len(ids), dtype=np.uint8)
            elif any(self._inside_token(enc, start) for start, _ in target):
                try:
                    ids, mask = self._piecewise(text, target, ids)
                except TemplateError as exc:
                    results[i] = Encoded(
                        outcome="rejected", reason="answer_boundary", error=str(exc)
                    )
                    continue
                retokenized = True
            else:
                mask = np.zeros(len(ids), dtype=np.uint8)
                n, size = len(ids), len(text)
                for start, end in target:
                    mask[
                        self._token_at(enc, start, size, n) : self._token_at(enc, end, size, n)
                    ] = 1
            results[i] = self._apply_length_policy(ids, mask)
            results[i].retokenized = retokenized and results[i].outcome == "kept"
        return results

    @staticmethod
    def _inside_token(enc: Any, char: int) -> bool:
        """Whether a token starts before `char` and covers it (it spans a target boundary)."""
        token = enc.char_to_token(char)
        return token is not None and enc.token_to_chars(token)[0] < char

    def _piecewise(
        self, text: str, spans: list[Span], joint: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ids and mask of `text` encoded piece by piece, cut at every target span boundary."""
        cuts = sorted({0, len(text), *(c for span in spans for c in span)})
        pieces = [(a, b) for a, b in itertools.pairwise(cuts) if b > a]
        encoded = self.backend.encode_batch(
            [text[a:b] for a, b in pieces], add_special_tokens=False
        )
        ids = np.concatenate([np.asarray(e.ids, dtype=np.int32) for e in encoded])
        mask = np.concatenate(
            [
                np.full(len(e.ids), any(s <= a and b <= t for s, t in spans), dtype=np.uint8)
                for (a, b), e in zip(pieces, encoded, strict=True)
            ]
        )
        decode = self.backend.decode
        if decode(ids.tolist(), skip_special_tokens=False) != decode(
            joint.tolist(), skip_special_tokens=False
        ):
            head = text[: spans[0][0]]
            raise TemplateError(
                f"the generation prompt ends in {head[-12:]!r}, inside a token the answer "
                "continues, and this tokenizer changes text encoded on its own (e.g. adds a "
                "leading space), so the answer cannot be encoded apart from the prompt: use a chat "
                "template whose generation prompt ends at a token boundary (no trailing space)"
            )
        return ids, mask

    def _token_at(self, enc: Any, char: int, text_len: int, n_tokens: int) -> int:
        """Index of the first token that starts at or after `char` (a target span boundary)."""
        if char >= text_len:
            return n_tokens
        token = enc.char_to_token(char)
        if token is None:
            # The char is in no token (end of text, or whitespace a normalizer dropped).
            offsets = enc.offsets
            return next((t for t, (s, _) in enumerate(offsets) if s >= char), len(offsets))
        start = enc.token_to_chars(token)[0]
        return token + 1 if start < char else token

    def _apply_length_policy(self, ids: np.ndarray, mask: np.ndarray) -> Encoded:
        cfg = self.config
        if len(ids) < cfg.min_tokens:
            return Encoded(outcome="filtered", reason="too_few_tokens")
        truncated = False
        if len(ids) > cfg.seq_len:
            if cfg.overlong == "drop":
                return Encoded(
                    outcome="filtered",
                    reason="too_long_tokens",
                    error=f"{len(ids)} tokens > seq_len {cfg.seq_len}",
                )
            truncated = True
            if cfg.overlong == "truncate":
                ids, mask = ids[: cfg.seq_len], mask[: cfg.seq_len]
        docs = []
        for start in range(0, len(ids), cfg.seq_len):
            chunk_ids = ids[start : start + cfg.seq_len]
            chunk_mask = mask[start : start + cfg.seq_len].copy()
            chunk_mask[0] = 0  # the first token of a document has nothing to predict it from
            if chunk_mask.any():
                docs.append((chunk_ids, chunk_mask))
        if not docs:
            return Encoded(outcome="filtered", reason="no_target_tokens")
        return Encoded(docs=docs, truncated=truncated)
