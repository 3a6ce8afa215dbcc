"""Convert public question/answer data into LLM-in-Sandbox task rows.

    python -m examples.llm_in_sandbox.convert IN.jsonl OUT.jsonl [--documents DIR]

Each input line is a JSON object with `question` (text), `answer` (text or number) and optionally
`id` and `documents`: the texts the answer is in, as one text, a list of texts (written as
`doc_1.txt`, `doc_2.txt`, ...) or an object `{file name: text}`. The output rows:

| input | family | files in the workspace | reward |
|---|---|---|---|
| no documents, an integer answer (math-style) | `math` | none | the integer, exactly |
| no documents, any other answer | `qa` | none | `tasks.answer_matches` |
| documents | `documents` | the row's folder `DIR/<id>/`, copied by `tasks.materialize` | `tasks.answer_matches` |

Documents go to files under `--documents DIR` (one folder per row, named by its id), never into the
row: the Controller hands a row's fields to the agent as environment variables. The row's
`documents` is that folder's absolute path (mount it at the same path in a Kubernetes pod).

Every bad line is reported (its number and why) and nothing is written; the exit code is then 1.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_INTEGER = re.compile(r"^-?\d{1,3}(,\d{3})+$|^-?\d+$")


class BadRow(ValueError):
    """One input line cannot be converted; the message says why."""


def _answer(row: dict[str, Any]) -> str:
    if "answer" not in row:
        raise BadRow("no 'answer'")
    answer = row["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise BadRow(f"'answer' must be a text or a number, not {type(answer).__name__}")
    text = str(answer).strip()
    if not text:
        raise BadRow("'answer' is empty")
    return text


def _documents(row: dict[str, Any]) -> dict[str, str]:
    """{file name: text} of the row's documents ({} for none)."""
    docs = row.get("documents")
    if docs is None or docs == "" or docs == [] or docs == {}:
        return {}
    if isinstance(docs, str):
        docs = [docs]
    if isinstance(docs, list):
        if not all(isinstance(d, str) for d in docs):
            raise BadRow("'documents' as a list must hold texts")
        docs = {f"doc_{i}.txt": d for i, d in enumerate(docs, 1)}
    if not isinstance(docs, dict):
        raise BadRow(f"'documents' must be a text, a list of texts or an object, not {type(docs).__name__}")
    for name, text in docs.items():
        if not _FILE.match(name):
            raise BadRow(f"document name {name!r}: letters, digits, '.', '_', '-' only, no folders")
        if not isinstance(text, str):
            raise BadRow(f"document {name!r} must be a text, not {type(text).__name__}")
    return docs


def convert_row(row: Any, line: int, documents_dir: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    """(the task row, its documents {name: text}); raises BadRow."""
    if not isinstance(row, dict):
        raise BadRow(f"expected a JSON object, got {type(row).__name__}")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BadRow("no 'question' text")
    answer = _answer(row)
    row_id = str(row.get("id", f"row-{line}"))
    if not _ID.match(row_id):
        raise BadRow(f"id {row_id!r}: letters, digits, '.', '_', '-' only (it names the documents folder)")
    docs = _documents(row)
    if docs:
        if documents_dir is None:
            raise BadRow("has documents: pass --documents DIR for their files")
        names = ", ".join(sorted(docs))
        question = f"{question.strip()}\n\nThe documents are in your workspace: {names}."
        folder = str((documents_dir / row_id).resolve())
        family = "documents"
    else:
        folder = ""
        family = "math" if _INTEGER.match(answer) else "qa"
        if family == "math":
            answer = answer.replace(",", "")
    task = {"id": row_id, "family": family, "seed": 0, "question": question, "answer": answer}
    return {**task, "documents": folder}, docs


def convert(lines: list[str], documents_dir: Path | None) -> tuple[list[tuple[dict, dict]], list[str]]:
    """(converted rows with their documents, error messages "line N: why")."""
    out: list[tuple[dict, dict]] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise BadRow(f"not JSON ({exc.msg} at column {exc.colno})") from None
            task, docs = convert_row(row, number, documents_dir)
            if task["id"] in seen:
                raise BadRow(f"id {task['id']!r} already on line {seen[task['id']]}")
            seen[task["id"]] = number
            out.append((task, docs))
        except BadRow as exc:
            errors.append(f"line {number}: {exc}")
    return out, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.llm_in_sandbox.convert",
        description="Convert question/answer rows (optionally with documents) into LLM-in-Sandbox task rows.",
    )
    parser.add_argument("input", type=Path, help="JSONL: question, answer, optional id and documents")
    parser.add_argument("output", type=Path, help="JSONL task rows for train_llm_in_sandbox_agent.py")
    parser.add_argument("--documents", type=Path, help="folder for the rows' documents (one folder per row)")
    args = parser.parse_args(argv)
    try:
        lines = args.input.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"convert: cannot read {args.input}: {exc}", file=sys.stderr)
        return 1
    rows, errors = convert(lines, args.documents)
    if not rows and not errors:
        errors.append(f"{args.input}: no rows")
    if errors:
        for error in errors:
            print(f"convert: {args.input}: {error}", file=sys.stderr)
        print(f"convert: {len(errors)} bad line(s); nothing written", file=sys.stderr)
        return 1
    try:
        for task, docs in rows:
            if docs:
                folder = Path(task["documents"])
                folder.mkdir(parents=True, exist_ok=True)
                for name, text in docs.items():
                    (folder / name).write_text(text, encoding="utf-8")
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text("".join(json.dumps(task) + "\n" for task, _ in rows), encoding="utf-8")
    except OSError as exc:
        print(f"convert: cannot write: {exc}", file=sys.stderr)
        return 1
    families = {f: sum(t["family"] == f for t, _ in rows) for f in ("math", "qa", "documents")}
    summary = ", ".join(f"{n} {f}" for f, n in families.items() if n)
    print(f"{args.output}: {len(rows)} rows ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
