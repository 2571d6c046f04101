"""Weighted mixes without Beam: the train_data_mix form, its checks and the sampling rule
(beam_preprocess/mix.py)."""

from __future__ import annotations

import pytest

from beam_preprocess.mix import (
    HISTOGRAM_BINS,
    MAX_PASSES,
    TRAIN,
    MixEntry,
    MixSources,
    bin_of,
    draw,
    format_mix,
    parse_mix,
    plan_of,
    resolve_mix,
)


def test_both_forms_parse_to_the_same_entries():
    text = "train=0.7,gs://b/general/*.jsonl=0.3"
    json_form = (
        '[{"uri": "train", "weight": 0.7}, {"uri": "gs://b/general/*.jsonl", "weight": 0.3}]'
    )
    assert parse_mix(text) == parse_mix(json_form)
    assert parse_mix(text)[0] == [MixEntry("train", 0.7), MixEntry("gs://b/general/*.jsonl", 0.3)]
    assert parse_mix("") == ([], [])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("train=0,b=1", "not a positive number"),
        ("train=-1", "not a positive number"),
        ("train=x", "not a positive number"),
        ("train=nan", "not a positive number"),
        ("train", "not a positive number"),
        ("=0.5,train=0.5", "empty source"),
        ("a=0.5,a=0.2", "named twice"),
        ("[1,2]", "expected {uri, weight}"),
        ("[{", "not valid JSON"),
    ],
)
def test_bad_mixes_name_the_entry(text, says):
    _, problems = parse_mix(text)
    assert len(problems) == 1 and says in problems[0]


def test_each_bad_entry_is_its_own_line():
    _, problems = parse_mix("a=0,=1,b=2,b=3")
    assert len(problems) == 3


def test_train_data_uri_takes_the_weight_left_when_unnamed():
    entries, problems = resolve_mix("gs://g/*.jsonl=0.2", "data/*.jsonl")
    assert problems == []
    assert [(e.uri, round(e.weight, 6)) for e in entries] == [
        ("data/*.jsonl", 0.8),
        ("gs://g/*.jsonl", 0.2),
    ]
    _, problems = resolve_mix("gs://g/*.jsonl=1.5", "data/*.jsonl")
    assert "leave train_data_uri no share" in problems[0]
    _, problems = resolve_mix("train=1,data/*.jsonl=1", "data/*.jsonl")
    assert "twice" in problems[0]


def test_named_weights_are_relative_and_replay_takes_its_fraction():
    entries, _ = resolve_mix("train=3,b=1", "w", ["general"], 0.2)
    assert [(e.uri, round(e.weight, 6), e.replay) for e in entries] == [
        ("w", 0.6, False),
        ("b", 0.2, False),
        ("general", 0.2, True),
    ]
    # replay alone makes a mix of the window and the replay source
    entries, _ = resolve_mix("", "w", ["p1", "p2"], 0.1)
    assert [(e.uri, round(e.weight, 6)) for e in entries] == [
        ("w", 0.9),
        ("p1", 0.05),
        ("p2", 0.05),
    ]
    assert resolve_mix("", "w", ["p"], 0.0) == ([], [])
    assert resolve_mix("", "w", [], 0.3) == ([], [])
    _, problems = resolve_mix("b=0.5", "w", ["b"], 0.1)
    assert "also in train_data_mix" in problems[0]
    # the step hands Beam the JSON form (URIs may hold commas)
    assert parse_mix(format_mix(entries))[0] == entries


def test_the_draw_is_deterministic_keyed_and_uniform():
    hashes = [f"{i:064x}" for i in range(4000)]
    draws = [draw(h, "llmft") for h in hashes]
    assert draws == [draw(h, "llmft") for h in hashes]
    assert draws != [draw(h, "other") for h in hashes]
    assert 0.47 < sum(draws) / len(draws) < 0.53
    assert all(0 <= bin_of(u) < HISTOGRAM_BINS for u in (0.0, 0.5, 0.999999))


def _flat(tokens: int) -> list[int]:
    return [tokens // HISTOGRAM_BINS] * HISTOGRAM_BINS


def test_plan_downsamples_the_abundant_and_repeats_the_scarce():
    # 90k vs 10k tokens at 0.5/0.5: N = 100k, 50k each
    plan = plan_of(["a", "b"], [0.5, 0.5], {0: _flat(90 * 1024), 1: _flat(10 * 1024)})
    a, b = plan.sources
    assert a.passes == 0 and abs(a.threshold - 50 / 90) < 1e-3
    assert b.passes == 4 and b.capped and plan.warnings  # 5 passes needed, MAX_PASSES used
    assert MAX_PASSES == 4
    plan = plan_of(["a", "b"], [0.6, 0.4], {0: _flat(70 * 1024), 1: _flat(30 * 1024)})
    a, b = plan.sources
    assert (a.passes, b.passes) == (0, 1)
    assert abs(a.threshold - 60 / 70) < 1e-3 and abs(b.threshold - 1 / 3) < 1e-3
    assert not plan.warnings
    # whole passes, then the remainder by u; eval is never repeated
    assert b.train_passes(0.2) == 2 and b.train_passes(0.9) == 1
    assert b.eval_kept(0.9) and a.eval_kept(0.1) and not a.eval_kept(0.95)


def test_plan_is_sized_by_train_data_uri_when_it_is_in_the_mix():
    # the window (train) 90k tokens at 0.9: N = 100k; a 50k extra source gives 10k, a 2k one
    # is repeated 4 times (it would need 5: capped)
    hist = {0: _flat(90 * 1024), 1: _flat(50 * 1024), 2: _flat(2 * 1024)}
    plan = plan_of([TRAIN, "big", "small"], [0.8, 0.1, 0.1], hist)
    train, big, small = plan.sources
    assert (train.passes, train.threshold) == (1, 0.0)  # every window token exactly once
    assert big.passes == 0 and abs(big.threshold - (0.1 * 90 / 0.8) / 50) < 1e-3
    assert small.passes == 4 and small.capped
    # a train source without tokens: sized by all sources together (b gives its half of them)
    plan = plan_of([TRAIN, "b"], [0.5, 0.5], {1: _flat(10 * 1024)})
    assert plan.sources[1].passes == 0 and abs(plan.sources[1].threshold - 0.5) < 1e-3


def test_plan_of_a_source_without_tokens_warns():
    plan = plan_of(["a", "b"], [0.5, 0.5], {0: _flat(1024)})
    assert plan.sources[1].passes == 0 and plan.sources[1].threshold == 0.0
    assert "no tokens" in plan.warnings[0]


def test_records_map_to_their_source():
    sources = MixSources(
        labels=(TRAIN, "bq://p.d.t"),
        shares=(0.5, 0.5),
        replay=(False, False),
        files={"/d/a.jsonl": 0},
        prefixes=(("bq://p.d.t@2026#", 1),),
    )
    assert sources.index_of("/d/a.jsonl:12") == 0
    parquet = MixSources(
        labels=("a", "b", "c"),
        shares=(0.4, 0.3, 0.3),
        replay=(False,) * 3,
        files={"gs://b/x.parquet": 0, "/d/y.json": 1, "/d/z:1.csv": 2},
    )
    assert parquet.index_of("gs://b/x.parquet#7") == 0
    assert parquet.index_of("/d/y.json[3]") == 1
    assert parquet.index_of("/d/z:1.csv:4") == 2
    assert sources.index_of("/d/a.jsonl") == 0
    assert sources.index_of("bq://p.d.t@2026#abc") == 1
    with pytest.raises(KeyError):
        sources.index_of("/elsewhere.jsonl:1")


def test_prompt_records_are_refused_in_a_mix_and_preference_pairs_are_not():
    from components.params.data_checks import PROMPTS_NOT_MIXED, check_train_data_mix

    mix = "train=0.7,gs://b/other.jsonl=0.3"
    assert check_train_data_mix(mix, "gs://b/w.jsonl", "", 0.0, "prompts") == [PROMPTS_NOT_MIXED]
    assert check_train_data_mix(mix, "gs://b/w.jsonl", "", 0.0, "preference") == []
    replay = check_train_data_mix("", "gs://b/w.jsonl", "general", 0.1, "prompts")
    assert replay == [PROMPTS_NOT_MIXED]
