"""`agl-server`: run the API Gateway. `agl-server port=8080 key=secret store.url=memory://`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import uvicorn
from omegaconf.errors import OmegaConfBaseException

from agentlightning.config.loader import load_cli_config
from agentlightning.log import configure_logging
from agentlightning.server.app import create_app
from agentlightning.server.config import load_server_config
from agentlightning.server.store import StoreLocked


def main(argv: Sequence[str] | None = None) -> None:
    cfg = load_cli_config("server", sys.argv[1:] if argv is None else argv, prog="agl-server")
    try:
        config = load_server_config(cfg)
        configure_logging(config.log_level)
        app = create_app(config)
    except (OmegaConfBaseException, ValueError) as exc:
        print(f"agl-server: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        uvicorn.run(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            access_log=False,
            timeout_keep_alive=75,
            backlog=4096,
            # Long-poll reads would otherwise hold a SIGTERM for up to long_poll_max_seconds.
            timeout_graceful_shutdown=3,
            ssl_certfile=config.tls.certfile or None,
            ssl_keyfile=config.tls.keyfile or None,
        )
    except StoreLocked as exc:
        print(f"agl-server: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
