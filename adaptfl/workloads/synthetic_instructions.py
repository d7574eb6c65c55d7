"""A small SYNTHETIC instruction set, generated here, offline: Alpaca-format records in four
categories, so a partition by category is non-IID (each client learns another skill).

It is not Alpaca-GPT4 and not human-written: every record comes from a template and a seeded
random draw, with exactly one correct response. It exists so that tests, the example and the
results run without a download; its numbers say how the algorithms compare on it, nothing
about instruction following in general.

    arithmetic   "What is 17 plus 25?"                          -> "17 plus 25 is 42."
    capitals     "Name the capital of France."                  -> "The capital of France is Paris."
    words        "Reverse the letters of the word below." +input -> the reversed word (or upper case)
    sorting      "Sort these numbers from smallest to largest." -> "2, 5, 9"

`python -m adaptfl.workloads.synthetic_instructions out.jsonl [count] [seed]` writes it as JSONL.
"""

from __future__ import annotations

import json
import random
import sys

CATEGORIES = ("arithmetic", "capitals", "words", "sorting")
CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "Austria": "Vienna", "Poland": "Warsaw", "Greece": "Athens", "Norway": "Oslo",
    "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen", "Ireland": "Dublin",
    "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi", "Egypt": "Cairo", "Kenya": "Nairobi",
    "Peru": "Lima", "Chile": "Santiago", "Canada": "Ottawa", "Mexico": "Mexico City",
    "Australia": "Canberra", "Brazil": "Brasilia", "Argentina": "Buenos Aires", "Turkey": "Ankara",
    "Hungary": "Budapest", "Belgium": "Brussels", "Netherlands": "Amsterdam", "Cuba": "Havana",
}
WORDS = ("apple", "river", "garden", "window", "planet", "silver", "candle", "forest", "bridge",
         "market", "rocket", "pencil", "orange", "island", "shadow", "winter", "mirror", "castle",
         "jacket", "turtle", "violin", "butter", "dragon", "harbor", "meadow", "puzzle", "tunnel")
OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}


def _arithmetic(rng: random.Random) -> tuple[str, str, str]:
    op = rng.choice(sorted(OPS))
    a, b = rng.randint(2, 60), rng.randint(2, 12 if op == "times" else 60)
    phrasing = rng.choice(("What is {a} {op} {b}?", "Compute {a} {op} {b}.",
                           "Calculate {a} {op} {b} and give the result."))
    return phrasing.format(a=a, op=op, b=b), "", f"{a} {op} {b} is {OPS[op](a, b)}."


def _capitals(rng: random.Random) -> tuple[str, str, str]:
    country = rng.choice(sorted(CAPITALS))
    if rng.random() < 0.5:
        return f"Name the capital of {country}.", "", f"The capital of {country} is {CAPITALS[country]}."
    return "What is the capital of the country below?", country, \
        f"The capital of {country} is {CAPITALS[country]}."


def _words(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    if rng.random() < 0.5:
        return "Reverse the letters of the word below.", word, word[::-1]
    return "Write the word below in capital letters.", word, word.upper()


def _sorting(rng: random.Random) -> tuple[str, str, str]:
    numbers = rng.sample(range(1, 100), rng.randint(3, 6))
    descending = rng.random() < 0.3
    order = "largest to smallest" if descending else "smallest to largest"
    return f"Sort these numbers from {order}.", ", ".join(map(str, numbers)), \
        ", ".join(map(str, sorted(numbers, reverse=descending)))


_MAKERS = {"arithmetic": _arithmetic, "capitals": _capitals, "words": _words, "sorting": _sorting}


def synthetic_instructions(count: int = 2000, seed: int = 0) -> list[dict[str, str]]:
    """`count` records (instruction, input, output, category), categories in turn; the same
    `count` and `seed` give the same records on every machine."""
    if count < len(CATEGORIES):
        raise ValueError(f"count={count} must be >= {len(CATEGORIES)} (one record per category)")
    rng = random.Random(seed)
    records = []
    for i in range(count):
        category = CATEGORIES[i % len(CATEGORIES)]
        instruction, text, output = _MAKERS[category](rng)
        records.append({"instruction": instruction, "input": text, "output": output,
                        "category": category})
    return records


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m adaptfl.workloads.synthetic_instructions OUT.jsonl [COUNT] [SEED]")
    rows = synthetic_instructions(*(int(a) for a in sys.argv[2:4]))
    with open(sys.argv[1], "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {len(rows)} synthetic records to {sys.argv[1]}")
