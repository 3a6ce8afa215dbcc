"""CPU cost per proxied call of the Gateway's metrics: ours (plain numbers, rendered when scraped)
against the same counts kept in prometheus-client's own Counter/Histogram children, side by side.

    .venv/bin/python bench/metrics_hot_path.py [--calls 200000]
    .venv/bin/python bench/metrics_hot_path.py --smoke   # 2,000 calls once: that it runs

One "call" is what the proxy records for one model call: the call counter, the latency and
upstream-latency histograms, the rate window, the store's append histogram and the events counter.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, Counter, Histogram

from agentlightning.server.metrics import CALL_BUCKETS, STORE_BUCKETS, CallRate, GatewayMetrics


def ours(n: int) -> float:
    m = GatewayMetrics()
    append = m.store_op("append_event")
    started = time.perf_counter()
    for _ in range(n):
        m.observe_call("train", 200, 0.1, 0.09, 0)
        append.observe(0.001)
        m.event_written("model_request")
    return (time.perf_counter() - started) / n


def client_children(n: int) -> float:
    r = CollectorRegistry()
    calls = Counter("c", "c", ["mode", "status"], registry=r).labels("train", "200")
    latency = Histogram("l", "l", ["mode"], buckets=CALL_BUCKETS, registry=r).labels("train")
    upstream = Histogram("u", "u", buckets=CALL_BUCKETS, registry=r)
    append = Histogram("s", "s", ["op"], buckets=STORE_BUCKETS, registry=r).labels("append_event")
    events = Counter("e", "e", ["type"], registry=r).labels("model_request")
    rate = CallRate()
    started = time.perf_counter()
    for _ in range(n):
        calls.inc()
        latency.observe(0.1)
        upstream.observe(0.09)
        rate.add()
        append.observe(0.001)
        events.inc()
    return (time.perf_counter() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs end to end")
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.repeat = 2_000, 1
    a, b = [], []
    for _ in range(args.repeat):  # interleaved: machine load hits both alike
        a.append(ours(args.calls))
        b.append(client_children(args.calls))
    ours_us, theirs_us = statistics.median(a) * 1e6, statistics.median(b) * 1e6
    print(f"ours (plain numbers):             {ours_us:.2f} µs per call")
    print(f"prometheus-client children:       {theirs_us:.2f} µs per call")
    print(f"ratio: {theirs_us / ours_us:.1f}x cheaper")


if __name__ == "__main__":
    main()
