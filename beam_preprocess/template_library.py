"""Chat templates that replace the tokenizer's own: named ones, or a Jinja string the user gives.

A base model's tokenizer often has no chat template; instruction data then needs one. The value
of the `chat_template` option is "" (the tokenizer's own), a name from `NAMED_TEMPLATES`, or a
Jinja template in transformers' `chat_template` dialect (`messages`, `add_generation_prompt`,
`eos_token`, ...). `resolve_template` gives the Jinja text; `template_error` says what is wrong
with a value before anything starts. The rendering itself is beam_preprocess.chat_template's.
"""

from __future__ import annotations

from beam_preprocess.shapes import ALPACA_INPUT_HEADER

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML (OpenAI's; Qwen and SmolLM2 use it): `<|im_start|>role\\ncontent<|im_end|>\\n` per
turn. On a base vocabulary without these special tokens they are tokenized as plain text."""

_ALPACA_PREAMBLE = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\\n\\n"
)
_ALPACA_PREAMBLE_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\\n\\n"
)
_JINJA_INPUT_HEADER = ALPACA_INPUT_HEADER.replace("\n", "\\n")
ALPACA = (
    "{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] + '\\n\\n' }}{% set turns = messages[1:] %}"
    "{% else %}{% set turns = messages %}"
    f"{{% if '{_JINJA_INPUT_HEADER}' in messages[0]['content'] %}}"
    f"{{{{ '{_ALPACA_PREAMBLE_INPUT}' }}}}{{% else %}}{{{{ '{_ALPACA_PREAMBLE}' }}}}{{% endif %}}"
    "{% endif %}"
    "{% for message in turns %}"
    "{% if message['role'] == 'user' %}"
    "{{ '### Instruction:\\n' + message['content'] + '\\n\\n### Response:\\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% if not loop.last %}{{ '\\n\\n' }}{% endif %}"
    "{% endif %}"
    "{% endfor %}"
)
"""The Stanford Alpaca prompt (tatsu-lab/stanford_alpaca's PROMPT_DICT): the preamble (the one
"paired with an input" when the instruction holds the Alpaca input, see beam_preprocess.shapes),
`### Instruction:`, `### Response:`, and the response ended by eos. A system turn replaces the
preamble. The `### Response:\\n` header is part of the prompt, so the response alone is trained."""

NAMED_TEMPLATES = {"chatml": CHATML, "alpaca": ALPACA}


def resolve_template(value: str) -> str | None:
    """The Jinja text of a `chat_template` value; None for "" (the tokenizer's own template)."""
    if not value:
        return None
    return NAMED_TEMPLATES.get(value, value)


def template_error(value: str) -> str | None:
    """What is wrong with a `chat_template` value (checked before anything starts), or None."""
    if not value or value in NAMED_TEMPLATES:
        return None
    if "{{" not in value and "{%" not in value:
        return (
            f"{value[:40]!r} is neither a named template ({', '.join(NAMED_TEMPLATES)}) nor a "
            "Jinja template (no {{ }} or {% %} in it)"
        )
    import jinja2

    try:
        jinja2.Environment().parse(value)
    except jinja2.TemplateSyntaxError as exc:
        return f"the Jinja template does not parse: {exc.message} (line {exc.lineno})"
    return None
