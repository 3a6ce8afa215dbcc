"""On-policy distillation (`algorithm.distill`) on the verl backend: the core's loop with
`VerlTrainer`, a real Gateway, a driver playing the agents, stand-in verl workers, and a real
teacher (`agl-torch-server` over HTTP). verl's batch carries, token by token, the advantage
computed here by hand from the teacher's log-probs (a forward pass of its weights) and the
student's (recorded, or the actor's where a call lacked them); a teacher of another vocabulary or
out of reach stops start-up before verl's workers start. That verl's loss takes per-token
advantages as they are is `test_cpu_update.py`'s `token_advantages` case."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from .conftest import SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

import torch

from agentlightning.client import GatewayClient
from agentlightning.config.schema import ConfigError
from agentlightning.launch import start_torch_server
from agentlightning.procs import free_port
from agentlightning.schemas import Rollout, RolloutState
from agentlightning.tiny_model import build_tiny, byte_tokenizer, save_tiny
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
from agentlightning.verl.backend import VerlTrainer
from tests.conftest import RunningGateway, trainer_key
from tests.torch_backend.tiny import TINY
from tests.trainer.driver import Driver, raw_call

from .standin import StandInWorkers
from .test_loop import config

pytestmark = pytest.mark.timeout(300)

RECORDED = [-0.5, -0.25, -0.125]  # the student's log-probs the Gateway records (even rollouts)
RECOMPUTED = -0.75  # the stand-in actor's log-prob of every token (odd rollouts record none)
KL_COEF, REWARD_COEF = 2.0, 0.5


def plan(rollout: Rollout) -> tuple[list[dict[str, Any]], float, RolloutState]:
    """Call, tool output, call; reward 0 or 1 in each group of 2; odd rollouts without log-probs."""
    index = trainer_key(rollout, "index_in_group") or 0
    prompt, first, tool, second = [1, 2, index], [10 + index, 11], [90, 91], [12 + index]
    lp = index % 2 == 0
    calls = [
        raw_call(prompt, first, RECORDED[:2] if lp else None),
        raw_call(prompt + first + tool, second, RECORDED[2:] if lp else None),
    ]
    return calls, float(index % 2), RolloutState.SUCCEEDED


class RecomputingWorkers(StandInWorkers):
    """Stand-in workers whose actor gives every token the log-prob `RECOMPUTED`."""

    def compute_log_probs(self, batch: Any) -> torch.Tensor:
        return RECOMPUTED * batch.batch["response_mask"].float()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """The student's folder, the teacher's (same tokenizer, other weights) and the teacher model."""
    root = tmp_path_factory.mktemp("models")
    student, tokenizer = build_tiny(TINY, seed=0)
    teacher, _ = build_tiny(TINY, seed=1)
    teacher.lm_head.weight.data *= 4  # log-probs far from the student's: a clear signal
    return (
        save_tiny(root / "student", student, tokenizer),
        save_tiny(root / "teacher", teacher, tokenizer),
        teacher,
    )


def distill_config(tmp_path: Path, gateway: RunningGateway, student: Path, **distill: Any) -> dict[str, Any]:
    cfg = config(tmp_path, gateway, 1)
    cfg["actor_rollout_ref"]["model"]["path"] = str(student)
    cfg["algorithm"] = {"distill": {"enable": True, "teacher_tokenizer": str(student), **distill}}
    return cfg


def teacher_log_probs(model: Any, prompt: list[int], response: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    return lp.gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1).tolist()


def test_the_teacher_scores_each_step_and_verls_batch_carries_the_per_token_advantages(
    gateway: RunningGateway, tmp_path: Path, models: tuple[Path, Path, Any]
) -> None:
    student, teacher_dir, teacher = models
    client = GatewayClient(gateway.url, gateway.key)
    workers = RecomputingWorkers(client)
    with start_torch_server(str(teacher_dir), torch_threads=1, log_path=tmp_path / "teacher.log") as server:
        cfg = distill_config(
            tmp_path, gateway, student, teacher_url=server.url, kl_coef=KL_COEF, reward_coef=REWARD_COEF
        )
        with Driver(gateway.url, gateway.key, plan):
            VerlTrainer(
                cfg, [{"id": f"t{i}"} for i in range(2)], [{"id": "v0"}], client, workers.factory
            ).fit()
    workers.close()
    client.close()

    grpo = 0.5 / (math.sqrt(0.5) + 1e-6)  # rewards 0 and 1 in a group: (r - 0.5) / (sample std + eps)
    kls: list[float] = []
    rows = 0
    for proto in workers.batches:
        t = proto.batch
        p_len = t["prompts"].shape[1]
        for k, rollout_id in enumerate(proto.non_tensor_batch["rollout_id"]):
            if rollout_id == "":  # a padding row: nothing to learn from
                assert t["advantages"][k].abs().sum() == 0
                continue
            rows += 1
            attention = t["attention_mask"][k].bool()
            prompt = t["prompts"][k][attention[:p_len]].tolist()
            response = t["responses"][k][attention[p_len:]].tolist()
            mask = t["response_mask"][k, : len(response)].tolist()
            index = prompt[-1]
            assert response == [10 + index, 11, 90, 91, 12 + index] and mask == [1, 1, 0, 0, 1]
            recorded = iter(RECORDED)
            student_lp = [(next(recorded) if index % 2 == 0 else RECOMPUTED) if m else 0.0 for m in mask]
            teacher_lp = teacher_log_probs(teacher, prompt, response)
            rollout_advantage = grpo if index % 2 else -grpo
            expected = [
                KL_COEF * (tl - sl) + REWARD_COEF * rollout_advantage if m else 0.0
                for sl, tl, m in zip(student_lp, teacher_lp, mask, strict=True)
            ]
            got = t["advantages"][k].tolist()
            assert got == pytest.approx(expected + [0.0] * (len(got) - len(response)), abs=1e-4), index
            kls += [sl - tl for sl, tl, m in zip(student_lp, teacher_lp, mask, strict=True) if m]
    assert rows == 4  # 2 prompts x 2 rollouts, one row each, every one scored
    (record,) = [r for r in read_metrics(tmp_path / "run" / METRICS_FILE) if r["step"] == 1]
    assert record["distill/rows"] == 4
    assert record["distill/reverse_kl"] == pytest.approx(sum(kls) / len(kls), abs=1e-4)


def test_a_teacher_of_another_vocabulary_stops_start_up_before_verl(
    gateway: RunningGateway, tmp_path: Path, models: tuple[Path, Path, Any]
) -> None:
    other = tmp_path / "byte-tokenizer"
    byte_tokenizer().save_pretrained(other)
    client = GatewayClient(gateway.url, gateway.key)
    workers = StandInWorkers(client)
    cfg = distill_config(
        tmp_path, gateway, models[0], teacher_url="http://127.0.0.1:9/v1", teacher_tokenizer=str(other)
    )
    with pytest.raises(
        ConfigError, match=r"algorithm\.distill\.teacher_tokenizer: the teacher's vocabulary differs"
    ):
        VerlTrainer(cfg, [{"id": "t0"}], None, client, workers.factory).fit()
    assert workers.total_optimizer_steps is None and workers.log == []  # verl's workers never started
    workers.close()
    client.close()


def test_a_teacher_out_of_reach_stops_start_up_naming_its_url(
    gateway: RunningGateway, tmp_path: Path, models: tuple[Path, Path, Any]
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    client = GatewayClient(gateway.url, gateway.key)
    workers = StandInWorkers(client)
    cfg = distill_config(tmp_path, gateway, models[0], teacher_url=url)
    with pytest.raises(ConfigError, match=rf"algorithm\.distill\.teacher_url: GET {url}/models failed"):
        VerlTrainer(cfg, [{"id": "t0"}], None, client, workers.factory).fit()
    assert workers.log == []
    workers.close()
    client.close()


def test_no_teacher_url_is_refused_before_anything_starts(
    tmp_path: Path, models: tuple[Path, Path, Any]
) -> None:
    cfg = {
        "actor_rollout_ref": {"model": {"path": str(models[0])}},
        "algorithm": {"distill": {"enable": True, "teacher_tokenizer": str(models[0])}},
        "trainer": {"output_dir": str(tmp_path / "run")},
    }
    with pytest.raises(
        ConfigError, match=r"algorithm\.distill\.enable needs algorithm\.distill\.teacher_url"
    ):
        VerlTrainer(cfg, [{"id": "t0"}])
