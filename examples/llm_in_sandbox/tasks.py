"""LLM-in-Sandbox's task families, generated here from a seed (nothing downloaded), their workspace
files and their rewards.

| family | the task | its files | reward |
|---|---|---|---|
| `math` | arithmetic too large to do in the head (sums of primes, modular powers, counting) | none | 1 if the integer is exact |
| `long_context` | the access code of one vault, hidden in a log of thousands of lines | `records.log` | 1 if the code is exact |
| `data` | revenue or a best region from a sales table | `sales.csv` | 1 if the number is within 0.005 / the name exact |

A task row is `{"id", "family", "seed", "question", "answer", "documents"}`; `materialize(family,
seed, dir)` writes the same files the answer was computed from, so a row stays small and the
Gateway never stores the long inputs. The answer never enters the sandbox (the agent holds it
outside). `documents` is `""` for these families.

Rows converted from public data (`convert.py`) add two families: `qa` (no files) and `documents`
(the files of the row's `documents` folder, copied into the workspace); both are rewarded by
`answer_matches` (numbers as numbers, text after normalisation). A math-style item with an
integer answer and no documents becomes a `math` row.

    python tasks.py [--out data] [--per-family 40] [--seed 11]     # data/train.jsonl, data/test.jsonl
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import random
import re
import shutil
import string
from pathlib import Path
from typing import Any

FAMILIES = ("math", "long_context", "data")  # generated here from a seed
CONVERTED = ("qa", "documents")  # from public data (convert.py); `math` rows come from there too
REGIONS = ["north", "south", "east", "west", "central"]
PRODUCTS = ["anvil", "bolt", "crank", "dynamo", "lever", "pulley", "rivet", "spring"]
_SYLLABLES = ["ka", "lo", "mi", "ru", "ze", "ta", "vo", "ni", "pe", "su", "dra", "qui"]


def _primes_below(n: int) -> list[int]:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
    return [i for i in range(n) if sieve[i]]


def _math(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(3)
    if kind == 0:
        n = rng.randrange(20_000, 60_000)
        return f"What is the sum of all prime numbers below {n}?", str(sum(_primes_below(n)))
    if kind == 1:
        a, b, m = rng.randrange(1000, 9999), rng.randrange(10**5, 10**6), rng.randrange(10**6, 10**7)
        return f"What is {a} raised to the power {b}, modulo {m}?", str(pow(a, b, m))
    n, p, q = rng.randrange(10**5, 10**6), rng.choice([7, 11, 13]), rng.choice([17, 19, 23])
    count = sum(1 for i in range(1, n + 1) if (i % p == 0) != (i % q == 0))
    return f"How many integers from 1 to {n} are divisible by exactly one of {p} and {q}?", str(count)


def _vaults(rng: random.Random) -> dict[str, str]:
    names: dict[str, str] = {}
    while len(names) < 6:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize()
        names[name] = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(10))
    return names


def _log_text(rng: random.Random, vaults: dict[str, str], lines: int = 4000) -> str:
    out = []
    slots = sorted(rng.sample(range(lines), len(vaults)))
    hidden = dict(zip(slots, vaults.items(), strict=True))
    for i in range(lines):
        stamp = f"2026-03-{1 + i // 200:02d}T{(i // 10) % 24:02d}:{(i * 7) % 60:02d}:{(i * 13) % 60:02d}Z"
        if i in hidden:
            name, code = hidden[i]
            out.append(f"{stamp} audit vault={name} access_code={code} rotated=true")
        else:
            status = rng.choice(["ok", "ok", "ok", "retry", "fail"])
            out.append(
                f"{stamp} worker={rng.randrange(1, 64):02d} job={rng.getrandbits(40):010x} status={status}"
            )
    return "\n".join(out) + "\n"


def _long_context(rng: random.Random) -> tuple[str, str]:
    vaults = _vaults(rng)
    name = rng.choice(sorted(vaults))
    question = (
        f"The file records.log in your workspace contains, somewhere among thousands of lines, the access "
        f"code of vault {name}. What is that access code?"
    )
    return question, vaults[name]


def _sales(rng: random.Random, rows: int = 400) -> list[dict[str, Any]]:
    return [
        {
            "region": rng.choice(REGIONS),
            "product": rng.choice(PRODUCTS),
            "units": rng.randrange(1, 500),
            "unit_price": round(rng.uniform(0.5, 99.0), 2),
        }
        for _ in range(rows)
    ]


def _data(rng: random.Random) -> tuple[str, str]:
    sales = _sales(rng)
    product = rng.choice(PRODUCTS)
    if rng.randrange(2) == 0:
        region = rng.choice(REGIONS)
        total = sum(
            r["units"] * r["unit_price"] for r in sales if r["product"] == product and r["region"] == region
        )
        question = (
            f"sales.csv in your workspace lists sales (region, product, units, unit_price). What is the total "
            f"revenue (units times unit_price) of product {product} in region {region}? Give two decimals."
        )
        return question, f"{total:.2f}"
    units = {
        r: sum(s["units"] for s in sales if s["product"] == product and s["region"] == r) for r in REGIONS
    }
    question = (
        f"sales.csv in your workspace lists sales (region, product, units, unit_price). Which region sold "
        f"the most units of product {product}?"
    )
    return question, max(REGIONS, key=lambda r: (units[r], r))


_MAKERS = {"math": _math, "long_context": _long_context, "data": _data}


def make_task(family: str, seed: int) -> dict[str, Any]:
    if family not in _MAKERS:
        raise ValueError(f"unknown task family {family!r}; one of {', '.join(FAMILIES)}")
    question, answer = _MAKERS[family](random.Random(f"{family}:{seed}"))
    return {
        "id": f"{family}-{seed}",
        "family": family,
        "seed": seed,
        "question": question,
        "answer": answer,
        "documents": "",
    }


def materialize(family: str, seed: int, workspace: Path, documents: str | None = None) -> None:
    """Write the task's files into `workspace`: the same random draws as `make_task`, or for the
    `documents` family a copy of the regular files in the folder `documents`."""
    if family == "documents":
        folder = Path(documents or "")
        if not documents or not folder.is_dir():
            raise ValueError(f"a documents task needs its documents folder; {documents!r} is not one")
        for source in sorted(folder.iterdir()):
            if source.is_file() and not source.is_symlink():
                shutil.copyfile(source, workspace / source.name)
        return
    rng = random.Random(f"{family}:{seed}")
    if family == "long_context":
        (workspace / "records.log").write_text(_log_text(rng, _vaults(rng)))
    elif family == "data":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=["region", "product", "units", "unit_price"])
        writer.writeheader()
        writer.writerows(_sales(rng))
        (workspace / "sales.csv").write_text(buffer.getvalue())
    elif family not in ("math", "qa"):
        raise ValueError(f"unknown task family {family!r}; one of {', '.join(FAMILIES + CONVERTED)}")


def _normalise(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the usual exact-match normalisation)."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def _number(text: str) -> float | None:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answer_matches(submitted: str, answer: str) -> bool:
    """The rule of the converted families: numbers equal as numbers (relative 1e-6), else the
    normalised texts equal."""
    want, got = _number(answer), _number(submitted)
    if want is not None:
        return got is not None and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
    return _normalise(submitted) == _normalise(answer) != ""


def reward(family: str, submitted: str | None, answer: str) -> float:
    """1.0 for a right answer by the family's rule, else 0.0; None (nothing submitted) is 0."""
    if submitted is None:
        return 0.0
    got = submitted.strip().strip("`'\"").strip()
    if family == "math":
        return 1.0 if got.replace(",", "").replace(" ", "") == answer else 0.0
    if family == "long_context":
        return 1.0 if got == answer else 0.0
    if family in CONVERTED:
        return 1.0 if answer_matches(got, answer) else 0.0
    if re.fullmatch(r"-?\d+(\.\d+)?", answer):  # data: a number
        try:
            return 1.0 if abs(float(got.replace(",", "")) - float(answer)) <= 0.005 else 0.0
        except ValueError:
            return 0.0
    return 1.0 if got.lower() == answer.lower() else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description="Write LLM-in-Sandbox task rows (train.jsonl, test.jsonl).")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "data"))
    parser.add_argument("--per-family", type=int, default=40)
    parser.add_argument("--seed", type=int, default=11, help="first seed; each family uses seed .. seed+n-1")
    args = parser.parse_args()
    rows = [make_task(f, args.seed + i) for i in range(args.per_family) for f in FAMILIES]
    n_test = len(rows) // 5
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("test", rows[:n_test]), ("train", rows[n_test:])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    print(f"{out}: {len(rows) - n_test} train and {n_test} test tasks ({', '.join(FAMILIES)})")


if __name__ == "__main__":
    main()
