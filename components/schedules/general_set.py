"""The packaged general-instruction replay set (`replay_source=general`): how it is made.

`general_instructions.jsonl` next to this module is written by `write()` from the templates
below: short, self-written general tasks (word opposites, sorting, counting, capitals, simple
definitions, rewriting), about 200 prompt/response records, no third-party text (the project's
own licence). It is small on purpose: a replay anchor for schedules and the demo, not a corpus;
a real schedule points `replay_source` at a larger general set (hf://, gs://) as well.
Regenerate: `python -m components.schedules.general_set`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

PATH = Path(__file__).with_name("general_instructions.jsonl")

_OPPOSITES = [
    ("hot", "cold"),
    ("up", "down"),
    ("early", "late"),
    ("open", "closed"),
    ("light", "dark"),
    ("full", "empty"),
    ("fast", "slow"),
    ("happy", "sad"),
    ("strong", "weak"),
    ("wet", "dry"),
    ("near", "far"),
    ("high", "low"),
    ("begin", "end"),
    ("buy", "sell"),
    ("win", "lose"),
    ("push", "pull"),
    ("young", "old"),
    ("thick", "thin"),
    ("loud", "quiet"),
    ("rich", "poor"),
]
_CAPITALS = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Germany", "Berlin"),
    ("Canada", "Ottawa"),
    ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Norway", "Oslo"),
    ("Greece", "Athens"),
    ("Chile", "Santiago"),
    ("Portugal", "Lisbon"),
    ("Poland", "Warsaw"),
    ("Ireland", "Dublin"),
    ("Austria", "Vienna"),
]
_DEFINITIONS = [
    ("a noun", "a word that names a person, place, thing or idea"),
    ("a verb", "a word that describes an action or a state"),
    ("a prime number", "a whole number above 1 whose only divisors are 1 and itself"),
    ("an even number", "a whole number divisible by 2"),
    ("a triangle", "a shape with three straight sides"),
    ("a synonym", "a word with the same or nearly the same meaning as another"),
    ("a vowel", "one of the letters a, e, i, o and u"),
    ("a century", "a period of one hundred years"),
]
_WORDS = [
    "apple",
    "river",
    "garden",
    "pencil",
    "cloud",
    "window",
    "tiger",
    "music",
    "bridge",
    "candle",
    "forest",
    "planet",
    "lemon",
    "rocket",
    "mirror",
    "valley",
    "button",
    "island",
    "meadow",
    "violin",
]


def records(seed: int = 7) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for a, b in _OPPOSITES:
        out.append({"prompt": f"What is the opposite of '{a}'?", "response": b})
        out.append({"prompt": f"What is the opposite of '{b}'?", "response": a})
    for country, city in _CAPITALS:
        out.append({"prompt": f"What is the capital of {country}?", "response": city})
        out.append({"prompt": f"{city} is the capital of which country?", "response": country})
    for term, meaning in _DEFINITIONS:
        out.append({"prompt": f"Define {term} in one sentence.", "response": f"It is {meaning}."})
    for _ in range(90):
        words = rng.sample(_WORDS, 4)
        out.append(
            {
                "prompt": f"Sort alphabetically: {', '.join(words)}.",
                "response": ", ".join(sorted(words)),
            }
        )
    for _ in range(60):
        word = rng.choice(_WORDS)
        out.append({"prompt": f"How many letters are in '{word}'?", "response": str(len(word))})
    for _ in range(60):
        word = rng.choice(_WORDS)
        out.append({"prompt": f"Write '{word}' in capital letters.", "response": word.upper()})
    for _ in range(40):
        word = rng.choice(_WORDS)
        out.append({"prompt": f"Spell '{word}' backwards.", "response": word[::-1]})
    unique = {r["prompt"]: r for r in out}  # random draws repeat: one record per prompt
    return list(unique.values())


def write(path: Path = PATH) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records()))
    return path


if __name__ == "__main__":
    print(write())
