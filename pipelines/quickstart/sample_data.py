"""Deterministic instruction data whose answers can be checked exactly.

Run: `llmft sample-data OUT_DIR`. Writes

    OUT_DIR/train.jsonl      {"prompt", "response", "task"} records (default 4,000)
    OUT_DIR/heldout.jsonl    prompts that never appear in train.jsonl (default 400)
    OUT_DIR/dirty.jsonl      train.jsonl with realistic bad records injected (see DIRTY_FRACTIONS)
    OUT_DIR/dirty_report.json  what was injected, by kind, with line numbers

Nothing is downloaded: the tasks are generated from a seeded RNG, so the same seed gives byte-identical
files. The tasks (arithmetic, sorting, reversing, counting letters, unit conversion) are small enough
for a few-million-parameter model to learn visibly in minutes on a CPU.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

CONSONANTS = "bcdfghklmnprstvz"
VOWELS = "aeiou"


def _word(rng: random.Random) -> str:
    """A pronounceable pseudo-word of 2-4 syllables (thousands of distinct ones)."""
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.randint(2, 4)))


# Fraction of the clean training records for each kind of bad record in dirty.jsonl. The
# duplicates are exact copies of clean records; the others are rejected or filtered downstream.
DIRTY_FRACTIONS = {
    "invalid_json": 0.01,
    "missing_field": 0.01,
    "empty_text": 0.01,
    "duplicate": 0.02,
}


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    return f"What is {a} + {b}?", str(a + b)


def _sub(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    return f"What is {a} - {b}?", str(a - b)


def _mul(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 99), rng.randint(2, 9)
    return f"What is {a} * {b}?", str(a * b)


def _sort(rng: random.Random) -> tuple[str, str]:
    nums = [rng.randint(0, 99) for _ in range(rng.randint(3, 6))]
    return f"Sort ascending: {' '.join(map(str, nums))}", " ".join(map(str, sorted(nums)))


def _reverse(rng: random.Random) -> tuple[str, str]:
    word = _word(rng)
    return f"Reverse the word: {word}", word[::-1]


def _count(rng: random.Random) -> tuple[str, str]:
    word = _word(rng)
    letter = rng.choice(sorted(set(word)))
    return f"How many times does '{letter}' appear in '{word}'?", str(word.count(letter))


def _convert(rng: random.Random) -> tuple[str, str]:
    unit, factor, target = rng.choice(
        [
            ("km", 1000, "m"),
            ("m", 100, "cm"),
            ("kg", 1000, "g"),
            ("h", 60, "min"),
            ("min", 60, "s"),
            ("L", 1000, "mL"),
            ("day", 24, "h"),
            ("ft", 12, "in"),
        ]
    )
    value = rng.randint(1, 250)
    return f"Convert {value} {unit} to {target}.", f"{value * factor} {target}"


TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "add": _add,
    "subtract": _sub,
    "multiply": _mul,
    "sort": _sort,
    "reverse": _reverse,
    "count_letters": _count,
    "convert_units": _convert,
}


def generate_records(n: int, seed: int, exclude: set[str] | None = None) -> Iterator[dict]:
    """Yield `n` unique-prompt records, round-robin over TASKS, skipping prompts in `exclude`."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    names = sorted(TASKS)
    produced, attempts = 0, 0
    while produced < n:
        attempts += 1
        if attempts > n * 200:
            raise ValueError(f"cannot generate {n} unique prompts: ask for fewer records")
        task = names[produced % len(names)]
        prompt, response = TASKS[task](rng)
        if prompt in seen:
            continue
        seen.add(prompt)
        produced += 1
        yield {"prompt": prompt, "response": response, "task": task}


def _dirty_lines(clean: list[dict], seed: int) -> tuple[list[str], dict]:
    """The clean records as JSONL lines with bad ones injected at seeded positions."""
    rng = random.Random(seed + 1)
    lines = [json.dumps(r) for r in clean]
    bad: list[tuple[str, str]] = []
    for kind, fraction in DIRTY_FRACTIONS.items():
        for _ in range(max(1, round(fraction * len(clean)))):
            source = rng.choice(clean)
            if kind == "invalid_json":
                line = json.dumps(source)[: rng.randint(5, 20)]  # truncated mid-record
            elif kind == "missing_field":
                line = json.dumps({"prompt": source["prompt"], "task": source["task"]})
            elif kind == "empty_text":
                line = json.dumps({**source, "response": "   "})
            else:
                line = json.dumps(source)
            bad.append((kind, line))
    for kind, line in bad:
        lines.insert(rng.randint(0, len(lines)), json.dumps({"__kind": kind}) + "\x00" + line)
    injected: dict[str, int] = dict.fromkeys(DIRTY_FRACTIONS, 0)
    line_numbers: dict[str, list[int]] = {}
    out: list[str] = []
    for number, line in enumerate(lines, start=1):
        if "\x00" in line:
            marker, line = line.split("\x00", 1)
            kind = json.loads(marker)["__kind"]
            injected[kind] += 1
            line_numbers.setdefault(kind, []).append(number)
        out.append(line)
    report = {
        "clean_records": len(clean),
        "injected": injected,
        "lines": line_numbers,
        "total_lines": len(out),
    }
    return out, report


def write_sample_data(
    out_dir: str | Path, n_train: int = 4000, n_heldout: int = 400, seed: int = 0
) -> dict:
    """Write train/heldout/dirty files to `out_dir` and return a summary of what was written."""
    if n_train < 10 or n_heldout < 1:
        raise ValueError("n_train must be >= 10 and n_heldout >= 1")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{str(out)!r} is a file: give a directory to write the data to")
    # Everything is generated before anything is created: a refusal (too many records for the
    # distinct prompts there are) leaves no directory behind.
    train = list(generate_records(n_train, seed))
    try:
        heldout = list(
            generate_records(n_heldout, seed + 1000, exclude={r["prompt"] for r in train})
        )
    except ValueError as exc:
        raise ValueError(
            f"held-out records, apart from the {n_train} training ones: {exc}"
        ) from None
    dirty, report = _dirty_lines(train, seed)
    files = {
        "train.jsonl": "".join(json.dumps(r) + "\n" for r in train),
        "heldout.jsonl": "".join(json.dumps(r) + "\n" for r in heldout),
        "dirty.jsonl": "".join(line + "\n" for line in dirty),
        "dirty_report.json": json.dumps(report, indent=2) + "\n",
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    return {
        "train": len(train),
        "heldout": len(heldout),
        "dirty_lines": len(dirty),
        "injected": report["injected"],
    }
