"""A corpus of facts about generated entities and multi-hop questions over it, made locally and
deterministically (the same seed gives the same files), so that Search-R1 runs without the
network and the answer cannot come from the model's memory: every name is invented, and each
question needs two documents (the entity's, then the one its fact points to).

    python make_data.py [--out data] [--people 60] [--seed 7]   # corpus.jsonl, train.jsonl, test.jsonl
    python make_data.py --out /tmp/big --people 20000             # a large corpus for the latency bench

corpus.jsonl rows are v1.0's / Search-R1's `{"id", "contents": "Title\\ntext"}`; question rows are
`{"id", "question", "golden_answers": [...], "data_source": "synthetic"}` as in its parquet files.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "n", "r", "s", "l", "m", "th", "x"]
INSTRUMENTS = ["cello", "harp", "oboe", "lute", "flute", "viola", "banjo", "sitar", "tuba", "zither"]
COLOURS = ["amber", "crimson", "teal", "ochre", "violet", "indigo", "saffron", "olive", "coral", "slate"]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def _names(rng: random.Random, n: int, syllables: int, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = _word(rng, syllables).capitalize()
        if name.lower() not in taken:
            taken.add(name.lower())
            out.append(name)
    return out


def generate(people: int = 60, seed: int = 7) -> tuple[list[dict], list[dict]]:
    """(corpus documents, questions). Cities ~ people/3, countries ~ people/10, companies ~ people/3."""
    rng = random.Random(seed)
    taken: set[str] = set()
    n_cities, n_countries, n_companies = max(3, people // 3), max(2, people // 10), max(3, people // 3)
    countries = _names(rng, n_countries, 3, taken)
    cities = _names(rng, n_cities, 2, taken)
    firsts = _names(rng, people, 2, taken)
    lasts = _names(rng, people, 3, taken)
    persons = [f"{f} {last}" for f, last in zip(firsts, lasts, strict=True)]
    companies = [f"{name} Works" for name in _names(rng, n_companies, 2, taken)]

    city_country = {c: rng.choice(countries) for c in cities}
    capital = {k: next((c for c in cities if city_country[c] == k), None) for k in countries}
    born = {p: rng.choice(cities) for p in persons}
    plays = {p: rng.choice(INSTRUMENTS) for p in persons}
    founder = {c: rng.choice(persons) for c in companies}
    company_city = {c: rng.choice(cities) for c in companies}
    colour = {c: rng.choice(COLOURS) for c in companies}

    docs: list[dict] = []
    for p in persons:
        text = f"{p} is a musician who plays the {plays[p]}. {p} was born in the city of {born[p]}."
        docs.append({"title": p, "text": text})
    for c in cities:
        text = f"{c} is a city in the country of {city_country[c]}. {c} has a river port and an old market."
        docs.append({"title": c, "text": text})
    for k in countries:
        seat = f"whose capital is {capital[k]}" if capital[k] else "without a capital city"
        text = f"{k} is a country {seat}. Its flag shows a {rng.choice(COLOURS)} star."
        docs.append({"title": k, "text": text})
    for c in companies:
        text = (
            f"{c} is a company founded by {founder[c]}. {c} is headquartered in {company_city[c]}. "
            f"Its logo is {colour[c]}."
        )
        docs.append({"title": c, "text": text})
    corpus = [
        {"id": str(i), "contents": f'"{d["title"]}"\n{d["text"]}'}
        for i, d in enumerate(rng.sample(docs, len(docs)))
    ]

    questions: list[dict] = []
    for p in persons:  # person -> city -> country
        questions.append(
            {"question": f"In which country was {p} born?", "golden_answers": [city_country[born[p]]]}
        )
    for c in companies:  # company -> founder -> instrument; company -> city -> country
        questions.append(
            {
                "question": f"Which instrument does the founder of {c} play?",
                "golden_answers": [plays[founder[c]]],
            }
        )
        questions.append(
            {
                "question": f"In which country is {c} headquartered?",
                "golden_answers": [city_country[company_city[c]]],
            }
        )
    rng.shuffle(questions)
    for i, q in enumerate(questions):
        q["id"] = f"synthetic-{i}"
        q["data_source"] = "synthetic"
    return corpus, questions


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "data"))
    parser.add_argument("--people", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--test-fraction", type=float, default=0.2)
    args = parser.parse_args()
    corpus, questions = generate(args.people, args.seed)
    n_test = max(1, int(len(questions) * args.test_fraction))
    out = Path(args.out)
    write_jsonl(out / "corpus.jsonl", corpus)
    write_jsonl(out / "test.jsonl", questions[:n_test])
    write_jsonl(out / "train.jsonl", questions[n_test:])
    print(f"{out}: {len(corpus)} documents, {len(questions) - n_test} train and {n_test} test questions")


if __name__ == "__main__":
    main()
