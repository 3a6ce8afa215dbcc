"""The retrieval service of Search-R1: its own process, HTTP, the wire shape of v1.0's
`retrieval_server.py` (Search-R1's), so either side can be swapped.

    python retrieval_server.py --corpus data/corpus.jsonl [--retriever bm25] [--port 8000] [--topk 3]
    python retrieval_server.py --corpus wiki-18.jsonl --retriever dense --dense-model /models/e5-base-v2 \\
        [--dense-index e5.npy]

POST /retrieve `{"queries": [str, ...], "topk": int?, "return_scores": bool}` →
`{"result": [[{"document": {"id", "contents", "title", "text"}, "score": float}, ...], ...]}`
(one list per query; without `return_scores` the documents alone). GET /healthz →
`{"status": "ok", "retriever", "documents"}`. A malformed request (no queries, an empty or
over-long query, too many queries, topk out of range, unknown fields) gets a 422 saying which
field and why; a query that matches nothing gets an empty list.

BM25 (`bm25s`, numpy only) is the default. `dense` embeds with a local Hugging Face encoder
(mean pooling, normalised; E5's `query: ` / `passage: ` prefixes when the name says e5) and
ranks by inner product; it needs `torch` and `transformers` in the interpreter that runs it and
a model directory on disk: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

log = logging.getLogger("search_r1.retrieval")

MAX_QUERIES = 64
MAX_QUERY_CHARS = 2000
MAX_TOPK = 100


class Retriever(Protocol):
    name: str

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """(document index, score) pairs per query, best first."""
        ...


def load_corpus(path: Path) -> list[dict[str, Any]]:
    """Search-R1's corpus rows (`{"id", "contents": "Title\\ntext"}`), with title and text split out."""
    docs = []
    with path.open() as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                contents = str(row["contents"])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise SystemExit(f"{path}:{n}: expected a JSON object with 'contents' ({exc})") from None
            title, _, text = contents.partition("\n")
            docs.append(
                {
                    "id": str(row.get("id", n - 1)),
                    "contents": contents,
                    "title": title.strip('"'),
                    "text": text,
                }
            )
    if not docs:
        raise SystemExit(f"{path}: no documents")
    return docs


class BM25Retriever:
    name = "bm25"

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        import bm25s

        self._bm25s = bm25s
        self.index = bm25s.BM25()
        self.index.index(
            bm25s.tokenize([d["contents"] for d in docs], stopwords="en", show_progress=False),
            show_progress=False,
        )
        self.size = len(docs)

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        out: list[list[tuple[int, float]]] = []
        for query in queries:
            tokens = self._bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)
            known = [t for t in tokens[0] if t in self.index.vocab_dict]
            if not known:  # nothing in the query occurs in the corpus
                out.append([])
                continue
            ids, scores = self.index.retrieve([known], k=min(k, self.size), show_progress=False)
            out.append([(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0])
        return out


class DenseRetriever:
    """A local encoder; corpus embeddings computed at start (or read from `index_path`, .npy)."""

    name = "dense"

    def __init__(self, docs: list[dict[str, Any]], model_dir: str, index_path: str | None = None) -> None:
        import numpy as np
        import torch
        from transformers import AutoModel, AutoTokenizer

        self._np, self._torch = np, torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.model = AutoModel.from_pretrained(model_dir, local_files_only=True).eval()
        self.e5 = "e5" in Path(model_dir).name.lower()
        if index_path and Path(index_path).exists():
            self.matrix = np.load(index_path)
        else:
            self.matrix = self.encode([d["contents"] for d in docs], passage=True)
            if index_path:
                np.save(index_path, self.matrix)
        if self.matrix.shape[0] != len(docs):
            raise SystemExit(f"{index_path}: {self.matrix.shape[0]} vectors for {len(docs)} documents")

    def encode(self, texts: Sequence[str], passage: bool = False, batch: int = 64) -> Any:
        prefix = ("passage: " if passage else "query: ") if self.e5 else ""
        parts = []
        with self._torch.no_grad():
            for start in range(0, len(texts), batch):
                enc = self.tokenizer(
                    [prefix + t for t in texts[start : start + batch]],
                    padding=True,
                    truncation=True,
                    max_length=256,
                    return_tensors="pt",
                )
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                parts.append(self._torch.nn.functional.normalize(pooled, dim=-1).float().numpy())
        return self._np.concatenate(parts)

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        scores = self.encode(queries) @ self.matrix.T
        k = min(k, scores.shape[1])
        out = []
        for row in scores:
            top = self._np.argsort(-row)[:k]
            out.append([(int(i), float(row[i])) for i in top])
        return out


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    queries: list[str] = Field(min_length=1, max_length=MAX_QUERIES)
    topk: int | None = Field(default=None, ge=1, le=MAX_TOPK)
    return_scores: bool = False

    @field_validator("queries")
    @classmethod
    def _non_empty(cls, queries: list[str]) -> list[str]:
        for n, query in enumerate(queries):
            if not query.strip():
                raise ValueError(f"query {n} is empty: put the search terms between <search> and </search>")
            if len(query) > MAX_QUERY_CHARS:
                raise ValueError(f"query {n} has {len(query)} characters; at most {MAX_QUERY_CHARS}")
        return queries


def create_app(docs: list[dict[str, Any]], retriever: Retriever, default_topk: int = 3) -> FastAPI:
    app = FastAPI(title="Search-R1 retrieval")

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's 422 without the echoed input (a 2000-character query need not come back).
        detail = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "retriever": retriever.name, "documents": len(docs)}

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict[str, Any]:
        started = time.perf_counter()
        hits = retriever.search(request.queries, request.topk or default_topk)
        result: list[list[Any]] = []
        for found in hits:
            if request.return_scores:
                result.append([{"document": docs[i], "score": s} for i, s in found])
            else:
                result.append([docs[i] for i, _ in found])
        log.info(
            "retrieve queries=%d topk=%d ms=%.2f",
            len(request.queries),
            request.topk or default_topk,
            (time.perf_counter() - started) * 1000,
        )
        return {"result": result}

    return app


def build_retriever(
    docs: list[dict[str, Any]], kind: str, dense_model: str | None, dense_index: str | None
) -> Retriever:
    if kind == "bm25":
        return BM25Retriever(docs)
    if not dense_model:
        raise SystemExit("--retriever dense needs --dense-model DIR (a local encoder, e.g. e5-base-v2)")
    if not Path(dense_model).is_dir():
        raise SystemExit(f"--dense-model {dense_model}: not a directory (models are never downloaded here)")
    return DenseRetriever(docs, dense_model, dense_index)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Search-R1's retrieval service (POST /retrieve, GET /healthz)."
    )
    parser.add_argument(
        "--corpus", required=True, help="corpus.jsonl: {id, contents: 'Title\\ntext'} per line"
    )
    parser.add_argument("--retriever", choices=("bm25", "dense"), default="bm25")
    parser.add_argument(
        "--dense-model", default=None, help="a local encoder directory (for --retriever dense)"
    )
    parser.add_argument(
        "--dense-index", default=None, help="a .npy of corpus embeddings: read, or written once"
    )
    parser.add_argument("--topk", type=int, default=3, help="documents per query when a request gives none")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")

    import uvicorn

    started = time.perf_counter()
    docs = load_corpus(Path(args.corpus))
    retriever = build_retriever(docs, args.retriever, args.dense_model, args.dense_index)
    log.info(
        "index ready retriever=%s documents=%d s=%.2f",
        retriever.name,
        len(docs),
        time.perf_counter() - started,
    )
    uvicorn.run(
        create_app(docs, retriever, args.topk), host=args.host, port=args.port, log_level=args.log_level
    )


if __name__ == "__main__":
    main()
