"""Config composition (verl's ppo_trainer defaults + ours), validation, and the version check."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

from omegaconf import DictConfig, OmegaConf

from agentlightning.config.schema import ConfigError
from agentlightning.trainer.config import core_config_keys
from agentlightning.verl.config import compose_config, router_replay_mode, validate, verl_view
from agentlightning.verl.version import SUPPORTED_VERL_VERSION, VerlVersionError, check_verl_version

REPO = Path(__file__).resolve().parents[2]
MODEL = "actor_rollout_ref.model.path=/models/tiny"


def load_config(name: str) -> DictConfig:
    """One of the package's YAML configs (agentlightning/config/NAME.yaml)."""
    cfg = OmegaConf.load(REPO / "agentlightning" / "config" / f"{name}.yaml")
    assert isinstance(cfg, DictConfig)
    return cfg


@pytest.fixture(scope="module")
def base() -> DictConfig:
    return compose_config(overrides=[MODEL])


def test_verl_defaults_and_our_keys_compose_and_validate(base: DictConfig) -> None:
    cfg = compose_config(overrides=[MODEL, "data.train_batch_size=4", "agentlightning.model_name=qwen"])
    settings, ours, view = validate(cfg)
    core = settings.core
    # verl's own defaults are there (from pkg://verl/trainer/config) ...
    assert view.actor_rollout_ref.actor.strategy == "fsdp"
    assert view.actor_rollout_ref.rollout.checkpoint_engine.backend == "naive"
    assert view.transfer_queue is not None and "ray_kwargs" in view
    # ... with ours over them, and the served model name is the Gateway's model name
    assert view.actor_rollout_ref.actor.policy_loss.loss_mode == "per_rollout_mean"
    assert view.actor_rollout_ref.actor.loss_agg_mode == "token-sum"
    assert view.actor_rollout_ref.rollout.engine_kwargs.vllm.served_model_name == "qwen"
    assert view.trainer.use_v1 is False
    assert core.train_batch_size == 4 and core.agl.model_name == "qwen"
    assert ours.old_log_prob_source == "rollout"
    # verl never sees our block or our keys
    assert "agentlightning" not in view
    assert "old_log_prob_source" not in view.actor_rollout_ref.actor


def test_every_core_key_is_in_the_packaged_config(base: DictConfig) -> None:
    for key in core_config_keys():
        if key.startswith("agentlightning."):
            continue  # the block is optional; its schema has the defaults
        assert OmegaConf.select(base, key, default="<absent>") != "<absent>", key


def test_a_torch_backend_config_drives_the_verl_backend_too() -> None:
    torch_cfg = load_config("train")
    cfg = compose_config(torch_cfg, [MODEL, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
    settings, ours, view = validate(cfg)
    core = settings.core
    assert core.rollout_n == torch_cfg.actor_rollout_ref.rollout.n
    assert ours.old_log_prob_source == torch_cfg.actor_rollout_ref.actor.old_log_prob_source
    # the torch engine's keys are left out of what verl sees
    assert "device" not in view.actor_rollout_ref.rollout
    assert "host" not in view.actor_rollout_ref.rollout


def test_the_kl_term_reaches_verl_with_its_reference_worker_set_up() -> None:
    overrides = ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.2"]
    _, _, view = validate(compose_config(overrides=[MODEL, *overrides]))
    actor = view.actor_rollout_ref.actor
    assert actor.use_kl_loss is True and actor.kl_loss_coef == 0.2 and actor.kl_loss_type == "low_var_kl"
    # verl builds the reference worker from these (its validate_config refuses the ref without them)
    assert view.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 4


def test_the_distill_block_is_read_by_the_backend_and_kept_from_verl() -> None:
    """On-policy distillation's keys are the torch backend's (`algorithm.distill.*`)."""
    cfg = compose_config(
        overrides=[
            MODEL,
            "algorithm.distill.enable=true",
            "algorithm.distill.teacher_url=http://127.0.0.1:9/v1",
            "algorithm.distill.teacher_tokenizer=/models/teacher",
            "algorithm.distill.reward_coef=0.5",
        ]
    )
    _, ours, view = validate(cfg)
    assert ours.distill.enable and ours.distill.kl_coef == 1.0 and ours.distill.reward_coef == 0.5
    assert ours.distill.teacher_url == "http://127.0.0.1:9/v1"
    assert "distill" not in view.algorithm  # verl's AlgoConfig has no such key


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov", "policy_loss.loss_mode"),
        ("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-max", "loss_agg_mode"),
        ("algorithm.rollout_correction.rollout_is=token", "rollout_correction"),
        ("actor_rollout_ref.actor.clip_ratio_hgih=0.3", "clip_ratio_hgih.*verl backend.*clip_ratio_high"),
        ("actor_rollout_ref.rollout.temprature=0.5", "temprature.*verl backend.*rollout.temperature"),
        ("algorithm.adv_estimater=rloo", "adv_estimater.*verl backend.*adv_estimator"),
        ("trainer.total_trainig_steps=3", "total_trainig_steps.*verl backend.*total_training_steps"),
        ("data.train_batch_szie=4", "train_batch_szie.*verl backend.*train_batch_size"),
        ("actor_rollout_ref.rollout.engine=vllm", "rollout.engine=.*only by the torch backend"),
        ("actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_type=k4", "kl_loss_type"),
        ("actor_rollout_ref.actor.entropy_coeff=0.01", "entropy_coeff"),
        ("actor_rollout_ref.rollout.name=sglang", "rollout.name"),
        ("actor_rollout_ref.model.lora_rank=8", "model.lora_rank"),
        ("actor_rollout_ref.actor.old_log_prob_source=fresh", "old_log_prob_source"),
        ("agentlightning.no_such_key=1", "agentlightning.no_such_key"),
        ("algorithm.distill.enable=true", "algorithm.distill.enable needs algorithm.distill.teacher_url"),
        (
            "algorithm.distill.kl_coeff=1.0",
            "algorithm.distill.kl_coeff.*did you mean algorithm.distill.kl_coef",
        ),
        ("data.train_batch_size=0", "data.train_batch_size"),
        ("trainer.n_gpus_per_node=3", "divisible"),  # verl's own validate_config
        ("actor_rollout_ref.actor.fsdp_config.mixed_precison.param_dtype=fp32", "mixed_precison"),
    ],
)
def test_bad_settings_fail_naming_the_key(override: str, names: str) -> None:
    cfg = compose_config(overrides=[MODEL, *override.split()])
    with pytest.raises(ConfigError, match=names.replace(".", r"\.").replace(r"\.*", ".*")):
        validate(cfg)


def test_fsdp_mixed_precision_is_read_as_verl_declares_it() -> None:
    # FSDPEngineConfig.mixed_precision is a free dict, absent from verl's packaged YAML
    override = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32"
    _, _, view = validate(compose_config(overrides=[MODEL, override]))
    assert view.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"


def test_the_engines_own_arguments_reach_it_as_given() -> None:
    """`rollout.engine_kwargs.vllm` is handed to vLLM as it is (the examples set its tool parser):
    not keys of verl's YAML, read all the same."""
    overrides = [
        "actor_rollout_ref.rollout.engine_kwargs.vllm.enable_auto_tool_choice=true",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser=hermes",
    ]
    _, _, view = validate(compose_config(overrides=[MODEL, *overrides]))
    assert view.actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser == "hermes"


def test_the_calc_x_example_trains_on_verl_too() -> None:
    """The config `examples/calc_x/train_calc_agent.py --backend verl` hands agl-train."""
    import importlib.util
    import sys

    path = REPO / "examples" / "calc_x" / "train_calc_agent.py"
    spec = importlib.util.spec_from_file_location("train_calc_agent_verl", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    launcher = sys.modules["launcher"]
    sample = str(REPO / "examples" / "calc_x" / "data" / "sample.jsonl")
    args, rest = launcher.parse_args(
        ["--train-file", sample, "--model", "/models/tiny", "--backend", "verl"], "t"
    )
    cfg = launcher.build_config(module.CALC_X, args, rest, "t")
    validate(compose_config(cfg))


def test_a_missing_model_path_fails_clearly() -> None:
    with pytest.raises(ConfigError, match=r"model\.path"):
        validate(compose_config())


def test_the_version_check_names_the_supported_release() -> None:
    assert check_verl_version() == SUPPORTED_VERL_VERSION
    with pytest.raises(VerlVersionError, match=r"supports verl 0\.9\.1 only, found verl 0\.8\.0"):
        check_verl_version("0.8.0")
    with pytest.raises(VerlVersionError, match="not installed"):
        check_verl_version("")


def test_verl_view_is_a_copy(base: DictConfig) -> None:
    view = verl_view(base)
    view.actor_rollout_ref.actor.ppo_epochs = 7
    assert base.actor_rollout_ref.actor.ppo_epochs != 7


def test_router_replay_mode_is_read_where_verl_reads_it(base: DictConfig) -> None:
    view = verl_view(base)
    assert router_replay_mode(view) == "disabled"  # fsdp: verl has no router replay there
    for strategy in ("megatron", "veomni"):
        cfg = compose_config(
            overrides=[
                MODEL,
                f"actor_rollout_ref.actor.strategy={strategy}",
                f"actor_rollout_ref.actor.{strategy}.router_replay.mode=R3",
            ]
        )
        assert router_replay_mode(verl_view(cfg)) == "R3"


@pytest.mark.parametrize(
    ("mode", "registered"),
    [("vanilla", "per_rollout_mean"), ("per_rollout_mean", "per_rollout_mean"), ("gspo", "per_rollout_gspo")],
)
def test_the_loss_mode_maps_to_verls_loss_fed_the_core_weights(mode: str, registered: str) -> None:
    cfg = compose_config(overrides=[MODEL, f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}"])
    _, _, view = validate(cfg)
    assert view.actor_rollout_ref.actor.policy_loss.loss_mode == registered
    assert view.actor_rollout_ref.actor.loss_agg_mode == "token-sum"


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_loss_agg_modes_are_the_core_weights_and_verl_sums_them(agg: str) -> None:
    cfg = compose_config(overrides=[MODEL, f"actor_rollout_ref.actor.loss_agg_mode={agg}"])
    settings, _, view = validate(cfg)
    core = settings.core
    assert core.loss_agg_mode == agg
    assert view.actor_rollout_ref.actor.loss_agg_mode == "token-sum"


@pytest.mark.parametrize("shipped", ["train", "demo"])
def test_every_key_of_the_torch_configs_is_read_or_at_its_torch_default(shipped: str) -> None:
    """agl-train's and agl-demo's configs drive the verl backend: verl reads each key, or the key
    is the torch backend's at its default (it asks for nothing); any other value fails."""
    torch_cfg = load_config("train")
    if shipped == "demo":
        merged = OmegaConf.merge(torch_cfg, load_config("demo").train)
        assert isinstance(merged, DictConfig)
        torch_cfg = merged
    validate(compose_config(torch_cfg, [MODEL, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]))


def test_the_collapse_guards_lr_scale_is_refused_where_verl_cannot_apply_it() -> None:
    base = [MODEL, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
    settings, _, _ = validate(compose_config(None, base))  # verl's default: the same lr after a rollback
    assert settings.trainer.collapse_guard.lr_scale == 1.0 and settings.trainer.keep_best
    validate(compose_config(None, [*base, "trainer.collapse_guard.lr_scale=0.5"]))  # the torch default: said
    validate(
        compose_config(
            None, [*base, "trainer.collapse_guard.action=stop", "trainer.collapse_guard.lr_scale=0.2"]
        )
    )
    with pytest.raises(
        ConfigError, match=r"trainer.collapse_guard.lr_scale=0.2: the verl backend rolls back"
    ):
        validate(compose_config(None, [*base, "trainer.collapse_guard.lr_scale=0.2"]))


def test_the_own_agent_pages_verl_lines_are_configs_verl_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/own_agent.md's `agl train … backend=verl` lines, with `--check`, on the starter
    (the torch lines: tests/test_docs_commands.py)."""
    from agentlightning.cli import main as agl

    from ..pages import commands

    lines = [
        w[1:] for w in commands("docs/own_agent.md") if w[:2] == ["agl", "train"] and "backend=verl" in w
    ]
    assert lines, "docs/own_agent.md shows no verl line"
    monkeypatch.chdir(tmp_path)
    assert agl(["init", "my_agent"]) == 0
    for words in lines:
        capsys.readouterr()
        assert agl([*words, "--check"]) == 0, " ".join(words)
        assert "good for the verl backend" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # verl's own check: 2 × 2 rollouts do not divide over 8 GPUs
        agl(["train", "my_agent/config.yaml", "backend=verl", "--check"])
    assert "must be divisible" in capsys.readouterr().err
