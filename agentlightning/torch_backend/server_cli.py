"""`agl-torch-server`: the built-in inference server as its own process.

    agl-torch-server model=PATH served_model_name=policy port=8000   (or python -m agentlightning.torch_backend.server_cli)

`model` is a Hugging Face model directory or a built-in model name (`demo`, see `models.py`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentlightning.log import get_logger
from agentlightning.openai_server.app import build_app, serve
from agentlightning.torch_backend.engine import TorchEngine
from agentlightning.torch_backend.models import load_model, resolve_device, resolve_dtype
from agentlightning.torch_backend.openai_backend import EngineBackend

log = get_logger("torch_server")


@dataclass
class ServeConfig:
    model: str = "demo"  # a Hugging Face model directory, or a built-in model ("demo": the demo's tiny model)
    served_model_name: str = "policy"
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16
    seed: int = 0
    max_num_seqs: int = 256
    max_model_len: int | None = None
    torch_threads: int | None = None
    log_level: str = "info"


def main(argv: Sequence[str] | None = None) -> None:
    from omegaconf import OmegaConf

    from agentlightning.config.schema import fill
    from agentlightning.log import configure_logging

    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(__doc__)
        print(OmegaConf.to_yaml(OmegaConf.structured(ServeConfig)))
        return
    try:
        cfg: ServeConfig = fill(ServeConfig, OmegaConf.from_dotlist(args), label="agl-torch-server")
        device = resolve_device(cfg.device)
        dtype = resolve_dtype(cfg.dtype, device)
    except Exception as exc:
        print(f"agl-torch-server: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(cfg.log_level)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    model, tokenizer = load_model(cfg.model, device, dtype, cfg.seed)
    engine = TorchEngine(
        model, tokenizer, max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len, seed=cfg.seed
    )
    log.info(
        "torch_server_ready", model=cfg.model, served=cfg.served_model_name, device=str(device), port=cfg.port
    )
    try:
        serve(build_app(EngineBackend(engine, cfg.served_model_name)), cfg.host, cfg.port)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
