"""The dashboard in a real headless Chromium, against a real Gateway whose rollouts were made
by a real controller running a scripted tool-using agent through the proxy.

Screenshots of each page go to $AGL_DASHBOARD_SCREENSHOTS when set (docs/img for the docs),
else to the test's temporary directory.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentlightning.aggregation import AggregationStats, aggregate_rollout
from agentlightning.client import GatewayClient
from agentlightning.procs import ManagedProcess
from agentlightning.schemas import Model
from tests.conftest import RunningGateway, start_gateway
from tests.controller.helpers import GATEWAY_OVERRIDES, local_config, start_controller, wait_terminal
from tests.fakes.model_server import FakeModelServer, Reply, ToolCall

KEY = "dashboard-key"
AGENT = "tests.dashboard.tool_agent.ToolAgent"
WAIT_MS = 30_000


@dataclass
class World:
    gw: RunningGateway
    client: GatewayClient
    controller: ManagedProcess
    shots: Path
    ids: dict[str, list[str]] = field(default_factory=dict)


def _replies() -> list[Reply]:
    calls = {"2+3": "2+3", "2+2": "2+2", "3+4 (fresh)": "3+4"}
    replies = [
        Reply(tool_calls=[ToolCall("calc", f'{{"expr": "{expr}"}}')], when=f"What is {q}?", times=100)
        for q, expr in calls.items()
    ]
    # The model always answers 5: right for 2+3, wrong for 2+2 (reward 0) and 3+4.
    return [*replies, Reply(content="The answer is 5.", times=1000)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("dashboard")
    shots = Path(os.environ.get("AGL_DASHBOARD_SCREENSHOTS") or tmp / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    with FakeModelServer() as fake:
        fake.script(*_replies())
        gw = start_gateway(tmp, KEY, *GATEWAY_OVERRIDES)
        controller = start_controller(gw.url, KEY, tmp / "logs", "local_runner.maximum_size=4")
        client = GatewayClient(gw.url, KEY)
        try:
            client.register_models([Model(model="policy", endpoint=fake.base_url, version=3)])
            plan = [
                ("right", "d-add", "2+3", True, 3),
                ("wrong", "d-bad", "2+2", True, 2),
                ("fresh", "d-fresh", "3+4 (fresh)", True, 1),
                ("val", "d-add", "2+3", False, 2),
            ]
            world = World(gw, client, controller, shots)
            specs: list[dict[str, Any]] = []
            for kind, data_id, question, is_train, n in plan:
                for i in range(n):
                    rid = f"{kind}-{i}-{uuid.uuid4().hex[:6]}"
                    world.ids.setdefault(kind, []).append(rid)
                    specs.append(
                        {
                            "rollout_id": rid,
                            "input": {"question": question},
                            "is_train": is_train,
                            "metadata": {"data_id": data_id},
                            "config": local_config(AGENT, QUESTION="input.question"),
                        }
                    )
            crash = f"crash-{uuid.uuid4().hex[:6]}"
            world.ids["crash"] = [crash]
            specs.append(
                {
                    "rollout_id": crash,
                    "input": {},
                    "metadata": {"data_id": "d-crash"},
                    "config": local_config("tests.controller.agents.CrashAgent"),
                }
            )
            client.create_rollouts(specs)
            wait_terminal(client, [s["rollout_id"] for s in specs], timeout=180)
            # Two training runs' metrics, as the trainer's Tracker posts them.
            for run, base in (("run-a", 0.2), ("run-b", 0.1)):
                for step in range(1, 11):
                    metrics = {
                        "training/reward": base + 0.05 * step,
                        "training/staleness/mean": 0.5,
                        "actor/ppo_kl": 0.001 * step,
                        "actor/entropy": 1.0 - 0.03 * step,
                        "actor/pg_clipfrac": 0.02,
                        "timing/step_s": 2.0 + 0.1 * (step % 3),
                    }
                    if step % 5 == 0:
                        metrics["val/reward"] = base + 0.04 * step
                    client.post_run_metrics(run, [{"step": step, "metrics": metrics}])
            yield world
        finally:
            client.close()
            controller.stop()
            gw.process.stop()


class Console:
    """Every console error and uncaught exception of a page."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))


def open_dashboard(browser: Any, world: World, key: str = KEY, hash_: str = "") -> tuple[Any, Console]:
    page = browser.new_page()
    console = Console(page)
    page.goto(f"{world.gw.url}/ui/{hash_}")
    page.fill("#key", key)
    page.click("#login button")
    return page, console


def api(world: World, path: str) -> Any:
    answer = httpx.get(f"{world.gw.url}{path}", headers={"x-api-key": KEY}, timeout=30)
    answer.raise_for_status()
    return answer.json()


def table_ids(page: Any) -> list[str]:
    return page.eval_on_selector_all("#rollouts tbody tr", "rows => rows.map(r => r.dataset.rollout)")


def wait_rows(page: Any, expected: set[str]) -> None:
    """Until the table shows exactly these rollouts (the page refreshes itself)."""
    page.wait_for_function(
        "ids => { const got = [...document.querySelectorAll('#rollouts tbody tr')].map(r => r.dataset.rollout);"
        " return got.length === ids.length && ids.every(i => got.includes(i)); }",
        arg=sorted(expected),
        timeout=WAIT_MS,
    )


def test_a_wrong_key_shows_nothing(browser: Any, world: World) -> None:
    page, console = open_dashboard(browser, world, key="not-the-key")
    page.wait_for_selector("#login-error:has-text('Wrong key')", timeout=WAIT_MS)
    assert page.is_visible("#login") and not page.is_visible("#nav")
    assert page.inner_text("#page") == ""
    assert page.query_selector("#count-total") is None
    page.screenshot(path=str(world.shots / "dashboard-login.png"))
    # The only console errors are the browser's own notes of the refused (401) requests.
    assert all("401" in e for e in console.errors), console.errors
    page.close()


def test_overview_counts_match_the_api(browser: Any, world: World) -> None:
    page, console = open_dashboard(browser, world)
    page.wait_for_selector("#count-total", timeout=WAIT_MS)
    everything = [r["status"]["state"] for r in api(world, "/api/rollouts?limit=10000")]
    assert page.inner_text("#count-total") == str(len(everything)) == "9"
    for state in ("queuing", "running", "succeeded", "failed"):
        assert page.inner_text(f"#count-{state}") == str(everything.count(state)), state
    assert page.inner_text("#count-failed") == "1"
    failures = page.inner_text("#failures")
    assert world.ids["crash"][0] in failures and "the agent broke on purpose" in failures
    assert re.search(r"policy\s+\S+\s+3", page.inner_text("#models"))
    assert page.inner_text("#proxy-inflight") == "0"
    assert re.fullmatch(r"\d+(\.\d+)?", page.inner_text("#calls-per-second"))
    page.screenshot(path=str(world.shots / "dashboard-overview.png"), full_page=True)
    assert console.errors == []
    page.close()


def test_rollouts_filters_search_and_live_updates(browser: Any, world: World) -> None:
    page, console = open_dashboard(browser, world, hash_="#/rollouts")
    page.wait_for_selector("#rollouts tbody tr", timeout=WAIT_MS)
    all_ids = {r["rollout_id"] for r in api(world, "/api/rollouts?limit=10000")}
    wait_rows(page, all_ids)
    page.select_option("#filter-state", "failed")
    wait_rows(page, set(world.ids["crash"]))
    page.select_option("#filter-state", "")
    wait_rows(page, all_ids)
    page.select_option("#filter-split", "val")
    wait_rows(page, set(world.ids["val"]))
    page.select_option("#filter-split", "train")
    train = {r for kind in ("right", "wrong", "fresh", "crash") for r in world.ids[kind]}
    wait_rows(page, train)
    page.fill("#search", "d-bad")
    page.press("#search", "Enter")
    wait_rows(page, set(world.ids["wrong"]))
    row = page.locator(f"tr[data-rollout='{world.ids['wrong'][0]}'] td")
    assert row.nth(3).inner_text() == "succeeded"
    assert row.nth(4).inner_text() == "0"  # reward 0: the model's answer was wrong
    assert row.nth(7).inner_text() == "2"  # model calls
    page.screenshot(path=str(world.shots / "dashboard-rollouts.png"), full_page=True)
    # Live: a rollout created now shows up without a reload (and the filters stay).
    page.fill("#search", "")
    page.press("#search", "Enter")
    wait_rows(page, train)
    page.select_option("#filter-split", "all")
    wait_rows(page, all_ids)
    new = f"late-{uuid.uuid4().hex[:6]}"
    world.client.create_rollouts([{"rollout_id": new, "input": {}, "metadata": {"data_id": "d-late"}}])
    wait_rows(page, all_ids | {new})
    world.client.delete_rollout(new)
    assert console.errors == []
    page.close()


def test_a_rollout_shows_its_tool_call_reward_and_training_rows(browser: Any, world: World) -> None:
    rid = world.ids["right"][0]
    page, console = open_dashboard(browser, world, hash_=f"#/rollout/{rid}")
    page.wait_for_selector("#conversation .call", timeout=WAIT_MS)
    assert page.inner_text("#reward") == "1"
    conversation = page.inner_text("#conversation")
    assert "tool call calc" in conversation and '{"expr": "2+3"}' in conversation
    assert "tool-result: 5" in conversation and "The answer is 5." in conversation
    assert "HTTP 200" in conversation and "v3" in conversation
    assert page.locator("#conversation .call").count() == 2
    assert page.locator("#history tbody tr").count() >= 3  # queuing, running, succeeded
    assert "succeeded" in page.inner_text("#history")
    # The training view is the trainer core's aggregation of the same calls.
    triplets = api(world, f"/api/rollouts/{rid}/events?format=triplet")
    rows = aggregate_rollout(triplets, rid, "d-add", 1.0, stats=AggregationStats())
    assert len(rows) == 1 and rows[0].n_calls == 2
    shown = page.locator("#training-rows tr.row")
    assert shown.count() == 1 and page.locator("#training-rows tr.break").count() == 0
    assert shown.locator("td.trainable").inner_text() == str(rows[0].n_trainable)
    assert shown.locator("td.context").inner_text() == str(len(rows[0].response_ids) - rows[0].n_trainable)
    page.screenshot(path=str(world.shots / "dashboard-rollout.png"), full_page=True)
    # The raw events open as JSON in a new tab.
    with page.context.expect_page() as raw_page:
        page.click("#raw-events")
    raw = raw_page.value
    raw.wait_for_load_state()
    assert '"event_type": "model_request"' in raw.content()
    raw.close()
    assert console.errors == []
    page.close()


def test_a_merge_break_is_explained(browser: Any, world: World) -> None:
    rid = world.ids["fresh"][0]
    page, console = open_dashboard(browser, world, hash_=f"#/rollout/{rid}")
    page.wait_for_selector("#training-rows tr.row", timeout=WAIT_MS)
    assert page.locator("#training-rows tr.row").count() == 2
    assert page.locator("#training-rows tbody").nth(0).locator("tr.break").count() == 0
    reason = page.locator("#training-rows tbody").nth(1).locator(".break-reason").inner_text()
    assert reason.startswith("merge break before row 2:")
    assert "differs from the row at token" in reason or "shorter than the row" in reason, reason
    assert page.inner_text("#reward") == "0"
    page.screenshot(path=str(world.shots / "dashboard-rollout-break.png"), full_page=True)
    assert console.errors == []
    page.close()


def test_training_page_plots_the_posted_metrics(browser: Any, world: World) -> None:
    page, console = open_dashboard(browser, world, hash_="#/training")
    page.wait_for_selector("[data-chart='Reward'] svg path", timeout=WAIT_MS)
    for title, n_series, n_points in (
        ("Reward", 2, 10),
        ("Validation reward", 2, 2),
        ("Staleness (policy versions)", 2, 10),
        ("KL", 2, 10),
        ("Entropy", 2, 10),
        ("Clip fraction", 2, 10),
        ("Step time (s)", 2, 10),
    ):
        chart = page.locator(f"[data-chart='{title}']")
        labels = chart.locator("svg path").evaluate_all("ps => ps.map(p => p.dataset.series)")
        assert len(labels) == n_series, (title, labels)
        assert chart.locator("svg circle").count() == n_series * n_points, title
    legend = page.inner_text("[data-chart='Reward'] .legend")
    assert "run-a · training/reward" in legend and "run-b · training/reward" in legend
    # Live: a new step appears without a reload.
    world.client.post_run_metrics("run-a", [{"step": 11, "metrics": {"training/reward": 0.8}}])
    page.wait_for_function(
        "() => document.querySelectorAll(\"[data-chart='Reward'] svg circle\").length === 21",
        timeout=WAIT_MS,
    )
    page.screenshot(path=str(world.shots / "dashboard-training.png"), full_page=True)
    assert console.errors == []
    page.close()


def test_a_run_with_several_policies_has_a_curve_per_policy(browser: Any, world: World) -> None:
    """docs/policies.md: each policy's metrics are posted under policy/NAME/."""
    for step in range(1, 4):
        world.client.post_run_metrics(
            "roles",
            [
                {
                    "step": step,
                    "metrics": {
                        "training/reward": 0.1 * step,
                        "policy/planner/training/reward": 0.2 * step,
                        "policy/writer/training/reward": 0.3 * step,
                        "policy/planner/actor/ppo_kl": 0.001,
                        "policy/writer/actor/ppo_kl": 0.002,
                    },
                }
            ],
        )
    page, console = open_dashboard(browser, world, hash_="#/training?runs=roles")
    page.wait_for_selector("[data-chart='Reward'] svg path", timeout=WAIT_MS)
    legend = page.inner_text("[data-chart='Reward'] .legend")
    for key in ("training/reward", "policy/planner/training/reward", "policy/writer/training/reward"):
        assert f"roles · {key}" in legend
    assert page.locator("[data-chart='KL'] svg circle").count() == 2 * 3
    assert console.errors == []
    page.close()


def test_a_key_link_logs_in_and_leaves_the_address_bar(browser: Any, world: World) -> None:
    page = browser.new_page()
    console = Console(page)
    page.goto(f"{world.gw.url}/ui/#key={KEY}")
    page.wait_for_selector("#count-total", timeout=WAIT_MS)
    assert KEY not in page.url and page.url.endswith("#/overview")
    assert console.errors == []
    page.close()
