#!/usr/bin/env python3
"""Generate payload/kv_calibration_prompts.jsonl, the FP8 KV calibration prompt set.

Why generated: the set must be diverse (KV activations differ between code, math,
chat, structured data, other languages and long documents; the largest values often
come from rare tokens and long positions) yet owe nothing to downloaded or copied
text. Every prompt is composed here from the project's own templates and word
lists with a fixed seed, so the file is reproducible byte for byte
(tests/fp8/test_fp8_calibrate.py regenerates it and compares).

    python3 scripts/make_kv_calibration_prompts.py [--check]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "payload" / "kv_calibration_prompts.jsonl"
SEED = 20261123
COUNTS = {"code": 60, "math": 50, "chat": 50, "structured": 15, "multilingual": 10, "long": 25}

LANGS = ["Python", "Rust", "Go", "C++", "TypeScript", "Java", "Bash", "SQL", "Haskell", "Kotlin"]
TASKS = [
    "a function that merges two sorted lists into one sorted list",
    "an LRU cache with O(1) get and put",
    "a tokenizer that splits arithmetic expressions into numbers, operators and parentheses",
    "a rate limiter using the token bucket algorithm",
    "a function that checks whether a string of brackets is balanced",
    "a breadth-first search over a grid with walls, returning the shortest path length",
    "a parser for a tiny INI file format with sections and key=value lines",
    "a thread-safe counter and a test that increments it from eight threads",
    "binary search over a rotated sorted array",
    "a function computing the edit distance between two words",
    "a retry helper with exponential backoff and jitter",
    "a trie supporting insert, search and prefix counting",
    "a streaming median of a sequence of integers",
    "topological sorting of a dependency graph with cycle detection",
    "a ring buffer of fixed capacity with push and pop",
]
CODE_ASKS = [
    "Write {task} in {lang}. Explain the time complexity.",
    "Implement {task} in {lang}, with doc comments and two unit tests.",
    "Review this plan and then write {task} in {lang}: keep it short and idiomatic.",
    "In {lang}, show {task}. Then list three edge cases and how the code handles them.",
]
SNIPPETS = [
    (
        "def f(xs):\n    out = []\n    for i, x in enumerate(xs):\n        if x % 2 == 0 and i > 0:\n"
        "            out.append(x * xs[i - 1])\n    return out\n"
    ),
    "fn sum_pairs(v: &[i64]) -> i64 {\n    v.windows(2).map(|w| w[0] * w[1]).sum()\n}\n",
    (
        "SELECT customer_id, COUNT(*) AS n\nFROM orders\nWHERE created_at >= DATE '2025-01-01'\n"
        "GROUP BY customer_id\nHAVING COUNT(*) > 3;\n"
    ),
    'for f in *.log; do\n  grep -c ERROR "$f" | xargs printf \'%s %s\\n\' "$f"\ndone\n',
    (
        "const debounce = (fn, ms) => {\n  let t;\n"
        "  return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); };\n};\n"
    ),
]
SNIPPET_ASKS = [
    "What does this code do, and is there a bug?\n\n{code}",
    "Rewrite this code to be clearer and faster:\n\n{code}",
    "Add error handling and type annotations to:\n\n{code}",
]

MATH_ASKS = [
    "What is {a} times {b}? Show the steps.",
    "Solve for x: {a}x + {b} = {c}.",
    "A train travels {a} km in {b} hours. What is its average speed in m/s?",
    "Find the greatest common divisor of {a} and {b} using Euclid's algorithm.",
    "Is {p} a prime number? Explain how you checked.",
    "Compute the sum of the first {a} odd numbers and prove the general formula.",
    "A box holds {a} red and {b} blue balls. Two are drawn without replacement. What is the probability both are red?",
    "Differentiate f(x) = {a}x^3 - {b}x^2 + {c}x and find its critical points.",
    "Integrate {a}x^2 + {b} from 0 to {c}.",
    "Convert {a} from base 10 to base 2, base 8 and base 16.",
    "The matrix [[{a}, {b}], [{c}, {a}]]: compute its determinant and its inverse if it exists.",
    "If an investment of {a} dollars grows {b}% per year, what is it worth after {c} years?",
]

CHAT_TOPICS = [
    "planning a week of vegetarian dinners",
    "learning to play the cello as an adult",
    "preparing for a job interview as a data engineer",
    "choosing a first telescope",
    "keeping houseplants alive in a dark flat",
    "writing a polite complaint to a landlord",
    "training for a first half marathon",
    "explaining recursion to a ten-year-old",
    "organising a small community library",
    "reducing the noise of a desktop computer",
    "what to pack for three days of hiking in autumn",
    "starting a vegetable garden on a balcony",
    "how tides work",
    "why the sky is blue at noon and red at sunset",
    "comparing trains and planes for a 600 km trip",
    "writing a toast for a friend's wedding",
]
CHAT_ASKS = [
    "Can you help me with {t}?",
    "I need advice on {t}. Keep it practical.",
    "Give me a short checklist for {t}.",
    "What are common mistakes people make when {t}?",
    "Write a friendly two-paragraph email about {t}.",
    "Explain {t} like I am new to it.",
]

NOUNS = [
    "the cache",
    "a scheduler",
    "the harbour",
    "an archive",
    "the council",
    "a glacier",
    "the orchard",
    "a telescope",
    "the ledger",
    "a compiler",
    "the river",
    "a courier",
    "the workshop",
    "a protocol",
    "the market",
    "a lighthouse",
    "the census",
    "a choir",
    "the bridge",
    "a satellite",
]
VERBS = [
    "records",
    "delays",
    "reshapes",
    "guards",
    "measures",
    "forgets",
    "rebuilds",
    "translates",
    "balances",
    "inspects",
    "borrows",
    "announces",
    "carries",
    "questions",
    "predicts",
]
OBJECTS = [
    "every request of the morning",
    "the old boundary stones",
    "a ledger of small debts",
    "the slow rise of the water",
    "seven unanswered letters",
    "the rules of the night shift",
    "a map nobody trusted",
    "the noise of the engines",
    "the price of bread",
    "a broken promise",
    "the cost of each delay",
    "the path of the comet",
    "a list of missing names",
]
CONNECT = [
    "Meanwhile,",
    "Later that year,",
    "For this reason,",
    "Even so,",
    "In the end,",
    "At first,",
    "By contrast,",
    "As a result,",
    "Quietly,",
    "Every spring,",
]

WORDS = {
    "fr": [
        "Le conseil municipal a voté un nouveau budget pour la bibliothèque.",
        "Pouvez-vous m'expliquer comment fonctionne un moteur électrique ?",
        "Nous avons marché le long de la rivière jusqu'au vieux moulin.",
    ],
    "de": [
        "Der Zug nach Hamburg hat heute zwanzig Minuten Verspätung.",
        "Wie berechnet man die Fläche eines unregelmäßigen Vielecks?",
        "Im Garten wachsen Tomaten, Bohnen und ein wenig Basilikum.",
    ],
    "es": [
        "El mercado abre temprano los sábados y cierra al mediodía.",
        "¿Cuál es la diferencia entre una lista y una tupla en Python?",
        "Mi abuela guardaba las recetas en un cuaderno azul.",
    ],
    "zh": ["今天的会议推迟到下午三点。", "请解释一下什么是哈希表。", "这座桥建于一百年前，现在仍然在使用。"],
    "ja": [
        "明日は雨が降るかもしれません。",
        "このプログラムの実行時間を短くする方法はありますか。",
        "駅の近くに新しい図書館ができました。",
    ],
}


def code(r: random.Random, i: int) -> str:
    if i % 4 == 3:
        return r.choice(SNIPPET_ASKS).format(code=r.choice(SNIPPETS))
    return r.choice(CODE_ASKS).format(task=r.choice(TASKS), lang=r.choice(LANGS))


def math_(r: random.Random, i: int) -> str:
    a, b, c = r.randint(2, 999), r.randint(2, 99), r.randint(2, 5000)
    p = r.choice([97, 221, 7919, 1001, 65537, 4096, 2027, 8633])
    return MATH_ASKS[i % len(MATH_ASKS)].format(a=a, b=b, c=c, p=p)


def chat(r: random.Random, i: int) -> str:
    return r.choice(CHAT_ASKS).format(t=CHAT_TOPICS[i % len(CHAT_TOPICS)])


def structured(r: random.Random, i: int) -> str:
    rows = [
        {
            "id": r.randint(1000, 9999),
            "name": r.choice(NOUNS).split()[-1],
            "qty": r.randint(0, 50),
            "price": round(r.uniform(0.5, 99.0), 2),
        }
        for _ in range(r.randint(4, 9))
    ]
    forms = [
        lambda: "Convert this JSON to a markdown table and add a total column:\n" + json.dumps(rows, indent=2),
        lambda: "Which rows have qty below 10? Answer as JSON.\n" + json.dumps(rows),
        lambda: "Write a CSV with a header for these records:\n" + "\n".join(str(x) for x in rows),
    ]
    return forms[i % len(forms)]()


def multilingual(r: random.Random, i: int) -> str:
    lang = sorted(WORDS)[i % len(WORDS)]
    lines = r.sample(WORDS[lang], k=len(WORDS[lang]))
    return "Translate to English and explain any idioms:\n" + "\n".join(lines)


def sentence(r: random.Random) -> str:
    return f"{r.choice(CONNECT)} {r.choice(NOUNS)} {r.choice(VERBS)} {r.choice(OBJECTS)}."


def long(r: random.Random, i: int) -> str:
    """A document of roughly 1,500-3,500 words (a few thousand tokens) and a question on it."""
    paras = []
    for p in range(r.randint(30, 60)):
        body = " ".join(sentence(r) for _ in range(r.randint(5, 9)))
        if p % 7 == 3:
            body += f" The committee noted figure {r.randint(1, 99)}.{r.randint(0, 9)} in item {p + 1}."
        paras.append(f"{p + 1}. {body}")
    q = r.choice(
        [
            "Summarise the document above in five bullet points.",
            "Which numbered paragraphs mention a figure, and what are the figures?",
            "List every distinct subject that appears in the document above.",
            "Write a one-paragraph abstract of the document above.",
        ]
    )
    return "Read the following report.\n\n" + "\n\n".join(paras) + "\n\n" + q


MAKERS = {
    "code": code,
    "math": math_,
    "chat": chat,
    "structured": structured,
    "multilingual": multilingual,
    "long": long,
}


def generate() -> str:
    r = random.Random(SEED)
    lines = []
    for cat, n in COUNTS.items():
        for i in range(n):
            lines.append(
                json.dumps({"id": f"{cat}-{i:03d}", "category": cat, "prompt": MAKERS[cat](r, i)}, ensure_ascii=False)
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = ap.parse_args(argv)
    text = generate()
    if args.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT.name}: {'up to date' if same else 'differs; rerun without --check'}")
        return 0 if same else 1
    sys.path.insert(0, str(OUT.parent.parent / "src"))
    from kimidflash.fsio import write_text_atomic

    write_text_atomic(OUT, text)
    print(f"wrote {OUT.name}: {sum(COUNTS.values())} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
