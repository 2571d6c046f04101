"""The chat template as string spans: rendered text plus the character spans trained on.

`ChatRenderer` renders conversations with the tokenizer's own template (transformers' Jinja), and
for the common single-turn case a probe-checked string pattern that skips Jinja (see the class).
beam_preprocess.tokenize maps the spans to tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from beam_preprocess.shapes import ALPACA_INPUT_HEADER

Span = tuple[int, int]


class ChatRenderer:
    """Renders conversations with the chat template and returns the target character spans.

    For the common single-turn case it can skip Jinja: the template is rendered once with
    sentinel contents and the result is used as a string pattern. This is only enabled when the
    pattern reproduces Jinja exactly on probe contents (whitespace, newlines, braces, special
    tokens) and, in `pair`, is re-checked against Jinja on the first records; any mismatch turns
    it off for good. Pipeline workers use the probe-checked pattern without Jinja (TokenizerSpec).
    """

    _VERIFY_FIRST = 16

    def __init__(self, tokenizer: Any, fast_path: bool = True) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "instruction data needs a tokenizer with a chat template (tokenizer.chat_template "
                "is empty): use the model's instruct tokenizer, or --data-kind text"
            )
        self.tokenizer = tokenizer
        self._check_sandbox()
        self._pattern: tuple[str, str, str] | None = self._compile() if fast_path else None
        self._verified = 0
        self.fast_path_disabled = False

    def _check_sandbox(self) -> None:
        """Refuse a template that Jinja's sandbox stops (`{{ cycler.__init__.__globals__ }}`:
        a template reaching for Python's internals) once, before any record: it would stop on
        every record. A template that refuses these probe messages (`raise_exception`) is left
        to judge each record (a dead letter per refused record)."""
        from jinja2.exceptions import SecurityError

        user = {"role": "user", "content": "hello"}
        try:
            self._render([user], generation_prompt=True)
            self._render([user, {"role": "assistant", "content": "hi"}])
        except SecurityError as exc:
            raise ValueError(
                f"the chat template uses something a template may not ({str(exc).rstrip('.')}): Jinja's sandbox "
                "stopped it; a chat template may only format the messages (check --chat-template "
                "or the tokenizer's tokenizer_config.json)"
            ) from None
        except Exception:  # judged per record, where it becomes a dead letter
            pass

    def _render(self, messages: Sequence[dict], generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=generation_prompt, tokenize=False
        )

    def _jinja_pair(self, prompt: str, response: str) -> tuple[str, Span]:
        user = {"role": "user", "content": prompt}
        head = self._render([user], generation_prompt=True)
        full = self._render([user, {"role": "assistant", "content": response}])
        if not full.startswith(head):
            raise TemplateError("the rendered prompt is not a prefix of the rendered conversation")
        return full, (len(head), len(full))

    def _compile(self) -> tuple[str, str, str] | None:
        p, r = "\ue000PROMPT\ue000", "\ue001RESPONSE\ue001"
        try:
            full, (start, _) = self._jinja_pair(p, r)
        except TemplateError:
            return None
        head_text = full[:start]
        if head_text.count(p) != 1 or full.count(r) != 1 or full[start:].count(p):
            return None
        before, after_prompt = head_text.split(p)
        rest = full[start:]
        mid, end = rest.split(r)
        if mid:  # text between the generation prompt and the content: not a plain pattern
            return None
        pattern = (before, after_prompt, end)
        probes = [
            ("a", "b"),
            ("  lead\n\ntrail  ", "\n{{ x }} {% y %}\t"),
            ("é ñ", ""),
            ("<|user|> <s> </s> [INST]", "'\"\\ \r\n done\n"),
            # Templates that branch on the content (the Alpaca one on its input header).
            (f"task{ALPACA_INPUT_HEADER}context", "answer"),
        ]
        for probe in probes:
            try:
                if self.pattern_pair(pattern, *probe) != self._jinja_pair(*probe):
                    return None
            except TemplateError:
                return None
        return pattern

    @staticmethod
    def pattern_pair(pattern: tuple[str, str, str], prompt: str, response: str) -> tuple[str, Span]:
        before, after_prompt, end = pattern
        head = before + prompt + after_prompt
        full = head + response + end
        return full, (len(head), len(full))

    def pair(self, prompt: str, response: str) -> tuple[str, list[Span]]:
        """Rendered text of a prompt/response pair and the span the model is trained on."""
        if self._pattern is not None:
            rendered = self.pattern_pair(self._pattern, prompt, response)
            if self._verified < self._VERIFY_FIRST:
                self._verified += 1
                if rendered != self._jinja_pair(prompt, response):
                    self._pattern, self.fast_path_disabled = None, True
                    rendered = self._jinja_pair(prompt, response)
        else:
            rendered = self._jinja_pair(prompt, response)
        return rendered[0], [rendered[1]]

    def conversation(self, messages: Sequence[dict]) -> tuple[str, list[Span]]:
        """Rendered multi-turn conversation; every assistant turn is a target span."""
        full = self._render(messages)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            head = self._render(messages[:i], generation_prompt=True)
            upto = self._render(messages[: i + 1])
            if not (upto.startswith(head) and full.startswith(upto)):
                raise TemplateError(
                    "the chat template does not render conversations prefix-consistently"
                )
            spans.append((len(head), len(upto)))
        return full, spans


class TemplateError(Exception):
    """A record the chat template cannot render into prompt/target spans."""
