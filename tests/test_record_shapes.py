"""Record shapes, chat templates and data-source URIs (issue 33): each shape on a small fixture,
with the exact text the model sees and the tokens it is trained on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from beam_preprocess.shapes import Invalid, Shape, example_of
from components.params.run_checks import run_errors

pytestmark = pytest.mark.unit

ALPACA_PREAMBLE_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
)
ALPACA_PREAMBLE = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n"
)

# (shape, record, the tiny tokenizer's own template, chatml, alpaca): the exact rendered texts.
# Targets are the assistant turns with their end-of-turn text (the tiny model's `<|end|>`, or
# chatml's `<|im_end|>\n`, or alpaca's eos).
CASES = {
    "prompt_response+system": (
        Shape.of("instruction", "prompt_response"),
        {"prompt": "Name a colour.", "response": "Blue", "system": "Answer in one word."},
        "<|system|>Answer in one word.<|end|><|user|>Name a colour.<|end|><|assistant|>Blue<|end|>",
        "<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\nName a colour."
        "<|im_end|>\n<|im_start|>assistant\nBlue<|im_end|>\n",
        "Answer in one word.\n\n### Instruction:\nName a colour.\n\n### Response:\nBlue<|end|>",
    ),
    "alpaca with input": (
        Shape.of("instruction", "alpaca"),
        {"instruction": "Add the numbers.", "input": "2, 3", "output": "5"},
        "<|user|>Add the numbers.\n\n### Input:\n2, 3<|end|><|assistant|>5<|end|>",
        "<|im_start|>user\nAdd the numbers.\n\n### Input:\n2, 3<|im_end|>\n"
        "<|im_start|>assistant\n5<|im_end|>\n",
        ALPACA_PREAMBLE_INPUT
        + "### Instruction:\nAdd the numbers.\n\n### Input:\n2, 3\n\n### Response:\n5<|end|>",
    ),
    "alpaca, empty input": (
        Shape.of("instruction", "alpaca"),
        {"instruction": "Say hi.", "input": "", "output": "Hi!"},
        "<|user|>Say hi.<|end|><|assistant|>Hi!<|end|>",
        "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\nHi!<|im_end|>\n",
        ALPACA_PREAMBLE + "### Instruction:\nSay hi.\n\n### Response:\nHi!<|end|>",
    ),
    "chat (OpenAI)": (
        Shape.of("instruction", "chat"),
        {
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "3+3?"},
                {"role": "assistant", "content": "6"},
            ]
        },
        "<|user|>2+2?<|end|><|assistant|>4<|end|><|user|>3+3?<|end|><|assistant|>6<|end|>",
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n6<|im_end|>\n",
        ALPACA_PREAMBLE + "### Instruction:\n2+2?\n\n### Response:\n4<|end|>\n\n"
        "### Instruction:\n3+3?\n\n### Response:\n6<|end|>",
    ),
    "sharegpt": (
        Shape.of("instruction", "sharegpt"),
        {
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello"},
            ]
        },
        "<|system|>Be brief.<|end|><|user|>Hi<|end|><|assistant|>Hello<|end|>",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n",
        "Be brief.\n\n### Instruction:\nHi\n\n### Response:\nHello<|end|>",
    ),
}
TARGETS = {
    "": {"<|end|>": "<|end|>"},
    "chatml": {"<|end|>": "<|im_end|>\n"},
    "alpaca": {"<|end|>": "<|end|>"},
}
ANSWERS = {
    "prompt_response+system": ["Blue"],
    "alpaca with input": ["5"],
    "alpaca, empty input": ["Hi!"],
    "chat (OpenAI)": ["4", "6"],
    "sharegpt": ["Hello"],
}


def _encode(tokenizer_dir: Path, template: str, examples: list[dict]) -> tuple[object, list]:
    from beam_preprocess.tokenize import (
        DocumentEncoder,
        EncoderConfig,
        TokenizerSpec,
        load_tokenizer,
    )

    tok = load_tokenizer(str(tokenizer_dir), template)
    spec = TokenizerSpec.of(tok, str(tokenizer_dir), True, template)
    config = EncoderConfig(data_kind="instruction", seq_len=512, overlong="drop")
    return tok, DocumentEncoder(spec, config).encode(examples)


@pytest.mark.parametrize("template", ["", "chatml", "alpaca"])
def test_each_shape_renders_exactly_and_trains_on_the_answers_only(
    tiny_model_dir: Path, template: str
):
    examples = [example_of(record, shape)[0] for shape, record, *_ in CASES.values()]
    tok, results = _encode(tiny_model_dir, template, examples)
    column = {"": 2, "chatml": 3, "alpaca": 4}[template]
    end = TARGETS[template]["<|end|>"]
    for (name, case), result in zip(CASES.items(), results, strict=True):
        expected = case[column]
        assert result.outcome == "kept", (name, result)
        ((ids, mask),) = result.docs
        ids = np.frombuffer(ids, np.int32) if isinstance(ids, bytes) else np.asarray(ids)
        mask = np.frombuffer(mask, np.uint8) if isinstance(mask, bytes) else np.asarray(mask)
        assert tok.decode(ids.tolist()) == expected, name
        # Each answer and its end of turn are targets, nothing else: the masked tokens are the
        # answers' exact tokens, in order.
        answers = [a + end for a in ANSWERS[name]]
        assert tok.decode(ids[mask == 1].tolist()) == "".join(answers), name
        # Before the first answer: exactly the tokens of the rendered prompt, none a target.
        first_target = int(np.argmax(mask))
        prompt_ids = tok(expected[: expected.index(answers[0])], add_special_tokens=False)
        assert ids[:first_target].tolist() == prompt_ids.input_ids, name


def test_alpaca_joins_instruction_and_input_as_the_alpaca_template_does():
    shape = Shape.of("instruction", "alpaca")
    record = {"instruction": "Translate.", "input": "Bonjour", "output": "Hello", "id": 7}
    example, unused = example_of(record, shape)
    assert example == {
        "messages": [
            {"role": "user", "content": "Translate.\n\n### Input:\nBonjour"},
            {"role": "assistant", "content": "Hello"},
        ]
    }
    assert unused == ["id"]
    # The input is read (not unused) even when it is empty; a missing output is an error.
    assert example_of({"instruction": "a", "input": "", "output": "b"}, shape)[1] == []
    with pytest.raises(Invalid, match="'output' is missing"):
        example_of({"instruction": "a", "input": "b"}, shape)


def test_prompt_response_counts_a_dropped_alpaca_input_as_unused():
    """The issue's bug: prompt/response fields pointed at Alpaca data dropped `input` silently."""
    shape = Shape.of("instruction", "prompt_response", prompt="instruction", response="output")
    record = {"instruction": "Translate.", "input": "Bonjour", "output": "Hello"}
    example, unused = example_of(record, shape)
    assert example["messages"][0]["content"] == "Translate."
    assert unused == ["input"]
    assert example_of({**record, "input": None}, shape)[1] == []  # null holds nothing


def test_field_names_are_parameters_and_empty_means_the_formats_default():
    assert Shape.of("instruction", "alpaca").prompt == "instruction"
    assert Shape.of("instruction", "sharegpt").messages == "conversations"
    assert Shape.of("text", "auto").text == "text"
    shape = Shape.of("instruction", "chat", messages="dialog", system="persona")
    record = {"dialog": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    example, unused = example_of({**record, "persona": "Kind.", "id": 3}, shape)
    assert example["messages"][0] == {"role": "system", "content": "Kind."}
    assert unused == ["id"]
    text_shape = Shape.of("text", "auto", text="body")
    assert example_of({"body": "plain", "title": "t"}, text_shape) == ({"text": "plain"}, ["title"])


def test_message_keys_besides_role_and_content_are_reported_unused():
    """A ShareGPT per-turn `weight` or an OpenAI `name` is not applied: counted, not hidden."""
    sharegpt = {
        "conversations": [
            {"from": "human", "value": "a", "weight": 0},
            {"from": "gpt", "value": "b", "weight": 1},
        ]
    }
    assert example_of(sharegpt, Shape.of("instruction", "sharegpt"))[1] == [
        "conversations[].weight"
    ]
    chat = {
        "messages": [
            {"role": "user", "content": "a", "name": "ann"},
            {"role": "assistant", "content": "b", "refusal": None},
        ]
    }
    assert example_of(chat, Shape.of("instruction", "chat"))[1] == ["messages[].name"]


@pytest.mark.parametrize(
    "messages",
    [
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]},
            {"role": "tool", "tool_call_id": "1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
        ],
        [
            {"role": "user", "content": "Weather?"},
            {"role": "function", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
        ],
    ],
)
def test_tool_turns_are_rejected_or_filtered_never_trained_on(messages: list[dict]):
    for policy, kind in (("reject", "rejected"), ("filter", "filtered")):
        with pytest.raises(Invalid) as info:
            example_of({"messages": messages}, Shape.of("instruction", "chat", tool_turns=policy))
        assert info.value.args[0] == "tool_turns"
        assert info.value.kind == kind
    sharegpt = [{"from": "human", "value": "a"}, {"from": "observation", "value": "b"}]
    with pytest.raises(Invalid, match="tool turn"):
        example_of({"conversations": sharegpt}, Shape.of("instruction", "sharegpt"))


def test_sharegpt_speakers_map_to_roles_and_unknown_ones_are_refused():
    shape = Shape.of("instruction", "sharegpt")
    record = {"conversations": [{"from": "user", "value": "a"}, {"from": "chatgpt", "value": "b"}]}
    assert [m["role"] for m in example_of(record, shape)[0]["messages"]] == ["user", "assistant"]
    with pytest.raises(Invalid, match="'narrator' is not a ShareGPT speaker"):
        example_of({"conversations": [{"from": "narrator", "value": "x"}]}, shape)


def test_chat_template_values_are_checked_before_anything_starts():
    from beam_preprocess.template_library import resolve_template, template_error

    assert template_error("") is None and template_error("chatml") is None
    assert resolve_template("") is None
    assert resolve_template("{{ messages }}") == "{{ messages }}"
    assert "neither a named template (chatml, alpaca)" in str(template_error("chatlm"))
    assert "does not parse" in str(template_error("{% for m in messages %}"))


def test_source_uris_parse_and_explain_mistakes():
    from beam_preprocess.sources import (
        HfDataset,
        parse_bigquery,
        parse_hf,
        snapshot_query,
        source_errors,
    )

    assert parse_hf("hf://datasets/tatsu-lab/alpaca") == HfDataset("tatsu-lab/alpaca")
    assert parse_hf("hf://datasets/o/n@v1.0:test") == HfDataset("o/n", "v1.0", "test")
    assert parse_hf("hf://datasets/o/n@refs/convert/parquet") == HfDataset(
        "o/n", "refs/convert/parquet"
    )
    table = parse_bigquery("bq://my-project.sft.pairs")
    assert snapshot_query(table, "2026-12-01T00:00:00Z") == (
        "SELECT * FROM `my-project.sft.pairs` FOR SYSTEM_TIME AS OF "
        "TIMESTAMP('2026-12-01T00:00:00Z')"
    )
    assert snapshot_query(table, "T", "SELECT q AS prompt FROM {table} WHERE ok") == (
        "SELECT q AS prompt FROM `my-project.sft.pairs` FOR SYSTEM_TIME AS OF TIMESTAMP('T') "
        "WHERE ok"
    )
    errors = source_errors(["hf://datasets/alpaca", "bq://p.d.t", "x.jsonl"], "SELECT 1")
    assert len(errors) == 3, errors
    assert "hf://datasets/ORG/NAME" in errors[0]
    assert "bq://PROJECT.DATASET.TABLE" in errors[1]
    assert "{table}" in errors[2]


def test_run_parameters_share_the_shapes_choices_and_check_the_new_rules():
    from beam_preprocess.data_shape import DataShape
    from components.params.run_params import RunParams, choices

    # One definition: the run parameters are preprocessing's data settings (DataShape).
    assert issubclass(RunParams, DataShape)
    assert choices("tool_turns") == ("reject", "filter")
    params = RunParams(
        train_data_uri="bq://my-project.sft.pairs",
        base_model="m",
        chat_template="chatlm",
        bigquery_query="SELECT * FROM t",
        data_kind="text",
        record_format="alpaca",
    )
    errors = "\n".join(run_errors(params))
    assert "record_format: record format 'alpaca' shapes instruction data" in errors
    assert "chat_template: 'chatlm' is neither a named template" in errors
    assert "name the table as {table}" in errors
    assert "set preprocess_runner=DataflowRunner" in errors
    hf = RunParams(train_data_uri="hf://datasets/o/n@main:train", base_model="m")
    assert run_errors(hf) == []


def test_the_preprocess_step_passes_shape_options_on_every_runner():
    """`beam_argv` drops Dataflow-only options locally; the record shape is not one of them."""
    from components.params.step_params import request_of
    from components.steps.preprocess import COMPONENT as PREPROCESS_STEP
    from components.steps.preprocess import beam_argv

    request = request_of(
        PREPROCESS_STEP,
        train_data_uri="hf://datasets/o/n:train",
        base_model="tok",
        data_kind="instruction",
        seq_len=128,
        eval_fraction=0.1,
        preprocess_runner="DirectRunner",
        project="",
        region="",
        work_uri="/runs/work",
        run_id="r1",
        dataflow_options={"max_num_workers": 3, "direct_num_workers": 2},
        dataflow_service_account="",
        hf_token_secret="",
        dataset=None,
        summary=None,
        gcp_resources="",
        record_format="alpaca",
        prompt_field="q",
        system_field="sys",
        tool_turns="filter",
        chat_template="chatml",
    )
    argv = beam_argv(request, "/out")
    for flag in (
        "--record-format=alpaca",
        "--prompt-field=q",
        "--system-field=sys",
        "--tool-turns=filter",
        "--chat-template=chatml",
        "--stage-dir=/runs/work/staged",
        "--direct_num_workers=2",
    ):
        assert flag in argv, (flag, argv)
    assert not any(a.startswith("--max_num_workers") for a in argv)
    assert not any(a.startswith("--response-field") for a in argv)  # empty: the default


def test_the_step_summary_lists_unused_fields():
    from components.steps.preprocess import summary_markdown

    stats = {
        "records_read": 3,
        "kept": 3,
        "filtered": 0,
        "duplicates": 0,
        "rejected": 0,
        "filtered_by_reason": {},
        "rejected_by_reason": {},
        "unused_fields": {"input": 2},
    }
    manifest = {
        "seq_len": 128,
        "splits": {"train": {"rows": 1, "documents": 3, "tokens": 100, "target_tokens": 9}},
        "stats": stats,
        "tokenizer": {"name_or_path": "tok"},
        "data_kind": "instruction",
    }
    assert "| field `input` present but unused | 2 |" in summary_markdown(manifest)


def test_auto_detects_each_shape_per_record():
    auto = Shape.of("instruction", "auto")
    records = [
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {"messages": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},
        {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},
        {"instruction": "a", "input": "", "output": "b"},
        {"prompt": "a", "response": "b"},
    ]
    pair = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    for record in records:
        assert example_of(record, auto) == ({"messages": pair}, []), record
    alpaca = {"instruction": "a", "input": "c", "output": "b"}
    assert example_of(alpaca, auto)[0]["messages"][0]["content"] == "a\n\n### Input:\nc"
    # A record with a prompt stays prompt/response; Alpaca's fields it holds are then unused.
    mixed = {"prompt": "a", "response": "b", "instruction": "x", "output": "y"}
    assert example_of(mixed, auto) == ({"messages": pair}, ["instruction", "output"])
