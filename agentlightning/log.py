"""structlog set-up: key-value lines, one event per line, on stderr."""

from __future__ import annotations

import logging
import sys

import structlog

CHATTY_LOGGERS = ("httpx", "httpcore")


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written: a logger is cached on its first use
    (`cache_logger_on_first_use`), and the stream it was bound to then may be gone by now (a
    redirected or captured stderr, in tests and in embedding programs)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "info") -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log_level must be one of debug, info, warning, error; got {level!r}")
    logging.basicConfig(stream=sys.stderr, level=numeric, format="%(message)s")
    # The HTTP clients log a line per request at info: below debug they would drown the console
    # (and the progress bar) in them; their warnings and errors still show.
    for chatty in CHATTY_LOGGERS:
        logging.getLogger(chatty).setLevel(
            numeric if numeric <= logging.DEBUG else max(numeric, logging.WARNING)
        )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=False),
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(
                key_order=["timestamp", "level", "event"], drop_missing=True
            ),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(component=name)
