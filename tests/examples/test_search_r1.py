"""Search-R1 end to end: the real agent (plain `openai` client) started by a real Controller for
rollouts on a real Gateway, searching the real retrieval service (BM25 over the generated
corpus, its own process), against the scripted model (real chat template and tokenizer).

The scripted model reads the question, searches the entity it names, reads the retrieved
document for the next hop, searches that, and answers from what it found: two real searches per
right answer. Three rollouts: answered right (reward 1); answered wrong after an empty search
(the service's 422 is shown to the model; reward 0); and one during which the retrieval service
is killed and started again (the agent retries until it is back; reward 1)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from agentlightning.procs import ManagedProcess, free_port
from tests.examples.stack import (
    EXAMPLES,
    EXAMPLES_PYTHON,
    RolloutResult,
    Stack,
    example_stack,
)

HERE = EXAMPLES / "search_r1"
AGENT = "search_r1_agent:SearchR1Agent"
ENV_MAP = {"QUESTION": "input.question", "GOLDEN_ANSWERS": "input.golden_answers"}


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"search_r1_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


agent = _load("search_r1_agent")
make_data = _load("make_data")


def _questions() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (HERE / "data" / "train.jsonl").read_text().splitlines()]


def _born_questions() -> list[dict[str, Any]]:
    return [q for q in _questions() if q["question"].startswith("In which country was")]


# --- fast: the reward and the data -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "golden", "value"),
    [
        ("<think>x</think> <answer> Beijing </answer>", ["beijing"], 1.0),
        ("<answer>The  Beijing.</answer>", ["Beijing"], 1.0),  # articles, punctuation, spaces
        ("<answer>Beijing</answer>", ["Shanghai", "Peking", "beijing"], 1.0),
        ("<answer>Beijing city</answer>", ["Beijing"], 0.0),  # exact, not contained
        ("<answer>Paris</answer> then <answer>Beijing</answer>", ["Beijing"], 1.0),  # the last one
        ("Beijing", ["Beijing"], 0.0),  # no answer tag
        (None, ["Beijing"], 0.0),
        ("<answer></answer>", [""], 1.0),
    ],
)
def test_exact_match_after_normalisation(reply: str | None, golden: list[str], value: float) -> None:
    assert agent.exact_match(reply, golden) == value


def test_one_answer_tag_scores() -> None:
    """v1.0 scores a reply with a single <answer> 0 (Search-R1's scorer expects prompt + reply)."""
    assert agent.exact_match("<answer> Gomgemouth </answer>", ["Gomgemouth"]) == 1.0


def test_golden_answers_from_env() -> None:
    assert agent.golden_answers('["a", "b"]') == ["a", "b"]
    assert agent.golden_answers("plain text") == ["plain text"]
    assert agent.golden_answers("42") == ["42"]


def test_generated_data_is_deterministic_and_needs_the_corpus(tmp_path: Path) -> None:
    corpus, questions = make_data.generate(60, 7)
    assert (corpus, questions) == make_data.generate(60, 7)
    assert make_data.generate(60, 8)[0] != corpus
    text = "\n".join(d["contents"] for d in corpus)
    for q in questions:  # invented names: the answer is in the corpus, the question names another entity
        (answer,) = q["golden_answers"]
        assert answer in text and answer not in q["question"]
    shipped = [json.loads(line) for line in (HERE / "data" / "corpus.jsonl").read_text().splitlines()]
    assert shipped == corpus  # data/ is what make_data.py writes by default


# --- the scripted model: two hops through the retrieval service ------------------------------------

_NEXT_HOP = [
    re.compile(r"was born in the city of (\w+)"),
    re.compile(r"is headquartered in (\w+)"),
    re.compile(r"is a company founded by (\w+ \w+)"),
]
_ANSWER = [re.compile(r"is a city in the country of (\w+)"), re.compile(r"plays the (\w+)")]


def _entity(question: str) -> str:
    for pattern in (r"was (.+) born\?", r"founder of (.+) play\?", r"is (.+) headquartered\?"):
        if found := re.search(pattern, question):
            return found.group(1)
    raise KeyError(question)


def _first_doc(information: str) -> str:
    return information.split("Doc 2(")[0]


class SearchPolicy:
    """Search the question's entity, then the entity its top document points to, then answer from
    the second top document. `wrong`: a question to answer with the first hop instead (after an
    empty search). `restart`: a question whose first search finds the service killed."""

    def __init__(self, wrong: str, restart: str, restart_service: Any) -> None:
        self.wrong, self.restart, self.restart_service = wrong, restart, restart_service
        self.restarted = False

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        question = messages[0]["content"].split("Question: ")[-1]
        infos = [m["content"] for m in messages[1:] if m["role"] == "user"]
        found = [i for i in infos if "<information>Doc 1" in i]
        if question == self.wrong and not infos:
            return "<think>I will search.</think><search> </search>"
        if not found:
            if question == self.restart and not self.restarted:
                self.restarted = True
                self.restart_service()
            return (
                f"<think>I need to find {_entity(question)}.</think>\n<search> {_entity(question)} </search>"
            )
        doc = _first_doc(found[-1])
        if len(found) == 1:
            hop = next(m.group(1) for p in _NEXT_HOP if (m := p.search(doc)))
            if question == self.wrong:
                return f"<answer> {hop} </answer>"
            return f"<think>Next: {hop}.</think>\n<search> {hop} </search>"
        answer = next(m.group(1) for p in _ANSWER if (m := p.search(doc)))
        return f"<think>Found it.</think>\n<answer> {answer} </answer>"


class RetrievalService:
    """The retrieval service as its own process; `restart_after_agent_retries` kills it and starts
    it again on the same port once an agent has logged that it is retrying."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[ManagedProcess] = []
        self.errors: list[str] = []
        self._thread: threading.Thread | None = None

    def start(self) -> ManagedProcess:
        proc = ManagedProcess(
            "retrieval",
            [
                str(EXAMPLES_PYTHON),
                str(HERE / "retrieval_server.py"),
                "--corpus",
                str(HERE / "data" / "corpus.jsonl"),
                "--port",
                str(self.port),
            ],
            self.work / f"retrieval-{len(self.procs)}.log",
        ).start()
        self.procs.append(proc)
        proc.wait_http_ok(f"{self.url}/healthz", timeout=120)
        return proc

    def restart_after_agent_retries(self) -> None:
        self.procs[-1].kill()

        def again() -> None:
            deadline = time.monotonic() + 120
            try:
                while not any(
                    "retrieval unavailable" in p.read_text(errors="replace")
                    for p in (self.work / "agents").glob("*/*.log")
                ):
                    if time.monotonic() > deadline:
                        raise TimeoutError("no agent logged a retry")
                    time.sleep(0.1)
                self.start()
            except Exception as exc:  # seen by the test
                self.errors.append(f"{type(exc).__name__}: {exc}")

        self._thread = threading.Thread(target=again, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join(150)
        for proc in self.procs:
            proc.stop(timeout=10)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, examples_python: str) -> Iterator[RetrievalService]:
    work = tmp_path_factory.mktemp("search_r1")
    svc = RetrievalService(work)
    try:
        svc.start()
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def ran(service: RetrievalService) -> Iterator[tuple[Stack, list[dict[str, Any]], list[RolloutResult]]]:
    right, wrong, restart = _born_questions()[:3]
    policy = SearchPolicy(wrong["question"], restart["question"], service.restart_after_agent_retries)
    env = {"SEARCH_R1_RETRIEVAL_URL": f"{service.url}/retrieve", "SEARCH_R1_MAX_TURNS": "4"}
    with example_stack(policy, "search_r1", service.work, maximum_size=3, agent_env=env) as stack:
        results = stack.run(AGENT, ENV_MAP, [right, wrong, restart], timeout=300)
        yield stack, [right, wrong, restart], results


@pytest.mark.process
def test_rewards_right_and_wrong(ran: tuple[Stack, list[dict[str, Any]], list[RolloutResult]]) -> None:
    _, _, (right, wrong, restart) = ran
    for result in (right, wrong, restart):
        assert result.state == "succeeded", f"{result.error}\n{result.log}"
    assert right.rewards == [1.0], right.log
    assert wrong.rewards == [0.0], wrong.log
    assert restart.rewards == [1.0], restart.log


@pytest.mark.process
def test_searches_are_real_and_every_call_has_token_ids(
    ran: tuple[Stack, list[dict[str, Any]], list[RolloutResult]],
) -> None:
    _, (question, *_), (right, *_) = ran
    calls = [c["data"] for c in right.model_requests]
    assert len(calls) == 3  # search, search, answer
    corpus = (HERE / "data" / "corpus.jsonl").read_text()
    person = _entity(question["question"])
    city = re.search(rf"{person} was born in the city of (\w+)", corpus).group(1)  # type: ignore[union-attr]
    country = question["golden_answers"][0]
    # The retrieved documents (the corpus's own text) are in the next prompts, as the model saw them.
    assert f"{person} was born in the city of {city}." in right.prompt_text(1)
    assert f"{city} is a city in the country of {country}." in right.prompt_text(2)
    assert f"<answer> {country} </answer>" in calls[2]["response"]["choices"][0]["message"]["content"]
    for result in ran[2]:
        for call in result.model_requests:
            response = call["data"]["response"]
            assert response["prompt_token_ids"] and response["choices"][0]["token_ids"]
            assert call["data"]["response"]["choices"][0]["logprobs"]["content"]


@pytest.mark.process
def test_a_bad_query_is_shown_to_the_model(
    ran: tuple[Stack, list[dict[str, Any]], list[RolloutResult]],
) -> None:
    _, _, (_, wrong, _) = ran
    assert "search error:" in wrong.prompt_text(1) and "query 0 is empty" in wrong.prompt_text(1)


@pytest.mark.process
def test_the_agent_survives_a_service_restart(
    ran: tuple[Stack, list[dict[str, Any]], list[RolloutResult]], service: RetrievalService
) -> None:
    _, _, (_, _, restart) = ran
    assert service.errors == []
    assert len(service.procs) == 2 and service.procs[0].proc.returncode is not None  # type: ignore[union-attr]
    assert "retrieval unavailable" in restart.log and "retrieval_retries=0" not in restart.log
    assert len(restart.model_requests) == 3


@pytest.mark.process
def test_rows_merge_into_one_per_rollout(
    ran: tuple[Stack, list[dict[str, Any]], list[RolloutResult]],
) -> None:
    """Plain user/assistant turns re-sent as written: each call's prompt extends the last one."""
    for result in ran[2]:
        assert result.merge_break() is None, result.merge_break()
        (row,) = result.rows
        assert row.n_calls == len(result.model_requests)


@pytest.mark.process
def test_bad_requests_get_a_422_saying_why(service: RetrievalService) -> None:
    url = f"{service.url}/retrieve"
    cases = {
        "missing": ({}, "Field required"),
        "no queries": ({"queries": []}, "at least 1"),
        "empty query": ({"queries": ["  "]}, "query 0 is empty"),
        "long query": ({"queries": ["x" * 5000]}, "at most 2000"),
        "too many": ({"queries": ["a"] * 65}, "at most 64"),
        "topk": ({"queries": ["a"], "topk": 0}, "greater than or equal to 1"),
        "unknown field": ({"queries": ["a"], "top_k": 3}, "Extra inputs"),
        "wrong type": ({"queries": "abc"}, "valid list"),
    }
    for name, (body, message) in cases.items():
        response = httpx.post(url, json=body, trust_env=False)
        assert response.status_code == 422, name
        assert message in response.text, (name, response.text)
        assert "xxxxxxxxxx" not in response.text  # the input is not echoed
    not_json = httpx.post(url, content=b"{", headers={"content-type": "application/json"}, trust_env=False)
    assert not_json.status_code == 422
    good = httpx.post(url, json={"queries": ["zzzz qqqq", "Works"], "topk": 2}, trust_env=False)
    assert good.status_code == 200
    nothing, works = good.json()["result"]
    assert nothing == [] and len(works) == 2 and all("Works" in d["title"] for d in works)


# --- the dense option, on a tiny encoder built here (random weights: the code path, not quality) ---


@pytest.mark.process  # imports torch and transformers
def test_dense_retriever_on_a_local_encoder(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from fastapi.testclient import TestClient

    from tests.fakes.scripted_model import build_tokenizer

    server = _load("retrieval_server")
    model_dir = tmp_path / "tiny-encoder"
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(model_dir)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    transformers.BertModel(config).save_pretrained(model_dir)
    docs = server.load_corpus(HERE / "data" / "corpus.jsonl")[:24]
    index = tmp_path / "dense.npy"
    dense = server.build_retriever(docs, "dense", str(model_dir), str(index))
    assert index.exists() and dense.matrix.shape == (len(docs), 32)
    client = TestClient(server.create_app(docs, dense))
    assert client.get("/healthz").json() == {"status": "ok", "retriever": "dense", "documents": len(docs)}
    body = {"queries": [docs[5]["contents"], docs[20]["contents"]], "topk": 4, "return_scores": True}
    first, second = client.post("/retrieve", json=body).json()["result"]
    assert len(first) == 4 and first[0]["document"]["id"] == docs[5]["id"]  # a text finds itself
    assert second[0]["document"]["id"] == docs[20]["id"] and second[0]["score"] == pytest.approx(
        1.0, abs=1e-4
    )
    again = server.build_retriever(docs, "dense", str(model_dir), str(index))  # the saved index is read
    assert (again.matrix == dense.matrix).all()
    with pytest.raises(SystemExit, match="needs --dense-model"):
        server.build_retriever(docs, "dense", None, None)
    with pytest.raises(SystemExit, match="never downloaded"):
        server.build_retriever(docs, "dense", "intfloat/e5-base-v2", None)
