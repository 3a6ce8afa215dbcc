"""The proxy's known-rollout cache: a deleted rollout is forgotten, even mid-read."""

from __future__ import annotations

from agentlightning.server.proxy.runtime import ProxyRuntime


def test_a_deleted_rollout_is_forgotten() -> None:
    runtime = ProxyRuntime()
    runtime.remember("r", runtime.forgotten)
    assert runtime.is_known("r")
    runtime.forget("r")
    assert not runtime.is_known("r")


def test_a_delete_during_the_store_read_wins_over_remember() -> None:
    runtime = ProxyRuntime()
    before_read = runtime.forgotten
    runtime.forget("r")  # deleted while the proxy was reading the store (which saw it)
    runtime.remember("r", before_read)
    assert not runtime.is_known("r")
    runtime.remember("r", runtime.forgotten)  # a later read that found it does count
    assert runtime.is_known("r")
