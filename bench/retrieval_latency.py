"""Search-R1's retrieval service: latency per query over HTTP, side by side with the same BM25
search in-process (the library alone), on a generated corpus of the size you choose.

    .venv-examples/bin/python bench/retrieval_latency.py [--people 20000] [--queries 300] [--topk 3]

Builds the corpus with `examples/search_r1/make_data.py` (20 000 people: ~35 000 documents),
starts `retrieval_server.py` as its own process on a free loopback port, sends the questions' entity
names one query per request (as the agent does), and prints p50 / p95 / mean milliseconds for both
and the ratio service / in-process (what HTTP, JSON and FastAPI add).
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parents[1] / "examples" / "search_r1"
sys.path.insert(0, str(HERE))

import make_data  # noqa: E402
import retrieval_server  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stats(ms: list[float]) -> str:
    ms = sorted(ms)
    return f"p50 {ms[len(ms) // 2]:7.2f}  p95 {ms[int(len(ms) * 0.95)]:7.2f}  mean {statistics.fmean(ms):7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=20000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a small corpus, a few queries: that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.people, args.queries = 300, 20

    corpus, questions = make_data.generate(args.people, seed=7)
    queries = [
        re.sub(
            r"^(In which country was |Which instrument does the founder of |In which country is )",
            "",
            q["question"],
        )
        .removesuffix(" born?")
        .removesuffix(" play?")
        .removesuffix(" headquartered?")
        for q in questions[: args.queries]
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        make_data.write_jsonl(path, corpus)
        docs = retrieval_server.load_corpus(path)
        started = time.perf_counter()
        local = retrieval_server.BM25Retriever(docs)
        index_s = time.perf_counter() - started

        in_process = []
        for q in queries:
            t = time.perf_counter()
            local.search([q], args.topk)
            in_process.append((time.perf_counter() - t) * 1000)

        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, str(HERE / "retrieval_server.py"), "--corpus", str(path), "--port", str(port),
             "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 300
            with httpx.Client(trust_env=False, timeout=30) as http:
                while True:
                    try:
                        if http.get(f"{url}/healthz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if server.poll() is not None or time.monotonic() > deadline:
                        assert server.stderr is not None  # stderr=PIPE
                        raise SystemExit(
                            f"the service did not start: {server.stderr.read().decode()[-2000:]}"
                        )
                    time.sleep(0.1)
                over_http = []
                hits = 0
                for q in queries:
                    t = time.perf_counter()
                    response = http.post(
                        f"{url}/retrieve", json={"queries": [q], "topk": args.topk, "return_scores": True}
                    )
                    over_http.append((time.perf_counter() - t) * 1000)
                    response.raise_for_status()
                    top = response.json()["result"][0]
                    hits += bool(top) and top[0]["document"]["title"] == q
        finally:
            server.terminate()
            server.wait(30)
    print(
        f"corpus: {len(docs)} documents, BM25 index built in {index_s:.1f} s; {len(queries)} queries, topk {args.topk}"
    )
    print(f"in-process bm25s : {_stats(in_process)}")
    print(f"retrieval service: {_stats(over_http)}")
    print(
        f"ratio service / in-process (p50): {sorted(over_http)[len(over_http) // 2] / sorted(in_process)[len(in_process) // 2]:.2f}"
    )
    print(f"top-1 is the queried entity's own document: {hits}/{len(queries)}")


if __name__ == "__main__":
    main()
