"""One log format for every process: the HTTP process, uvicorn and the runtime process.

JSON lines by default (one object per line: ``time``, ``level``, ``logger``, ``process``,
``pid``, ``message``, ``request_id`` when there is one, ``exc_info`` with a traceback, and
any ``extra=`` fields); ``DATARAX_LOG_FORMAT=text`` for people reading a terminal.

The request id lives in :data:`REQUEST_ID`, a contextvar: the HTTP process sets it per
request (:mod:`app.api.request_context`), the runtime per command
(:func:`app.runtime.server.execute`, from the channel header). :class:`RequestIdFilter`
copies it onto every record, so every line logged while handling that request carries it.

Shared by both processes (like :mod:`app.core.errors`): imports nothing of either.
"""

from __future__ import annotations

import json
import logging
import logging.config
import time
from contextvars import ContextVar
from typing import Any

import orjson

REQUEST_ID: ContextVar[str | None] = ContextVar("datarax_request_id", default=None)
"""The id of the request being handled in this context, ``None`` outside one."""

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id"}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process_label)s %(request_id)s] %(message)s"


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` (``-`` outside a request) and ``record.process_label``."""

    def __init__(self, process_label: str = "http") -> None:
        super().__init__()
        self.process_label = process_label

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get() or "-"
        record.process_label = self.process_label
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (orjson: every request writes an access
    line, and the standard library's encoder and ``strftime`` made it about a tenth of a
    small job push's server time)."""

    _second = -1
    _second_text = ""

    def _time(self, created: float, msecs: float) -> str:
        second = int(created)
        if second != self._second:  # one strftime a second, not one a line
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._second_text}.{int(msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self._time(record.created, record.msecs),
            "level": record.levelname.lower(),
            "logger": record.name,
            "process": getattr(record, "process_label", None),
            "pid": record.process,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id and request_id != "-":
            entry["request_id"] = request_id
        if record.name == "uvicorn.access" and isinstance(record.args, tuple):
            # uvicorn's access line: (client, method, path, http version, status)
            if len(record.args) == 5:
                client, method, path, _, status = record.args
                entry.update(client=client, method=method, path=path, status=status)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key != "process_label" and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        try:
            return orjson.dumps(entry, default=str).decode()
        except TypeError:  # what orjson refuses outright (an int past 64 bits)
            return json.dumps(entry, default=str, ensure_ascii=False)


def log_config(log_format: str, level: str, process_label: str = "http") -> dict[str, Any]:
    """The ``logging.config.dictConfig`` of a process: one stderr handler on the root
    logger, and uvicorn's loggers without handlers of their own (they propagate to it).

    The same dict is uvicorn's ``log_config`` (:func:`app.cli.cli`), so uvicorn does not
    install its own formats.

    Args:
      log_format: ``json`` or ``text``.
      level: a level name (``info``, ``DEBUG``, ...).
      process_label: ``http`` or ``runtime``: the ``process`` field of each line.
    """
    formatter: dict[str, Any] = (
        {"()": JsonFormatter}
        if log_format == "json"
        else {"format": TEXT_FORMAT, "class": "logging.Formatter"}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter, "process_label": process_label}},
        "formatters": {"datarax": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "datarax",
                "filters": ["request_id"],
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            name: {"handlers": [], "propagate": True, "level": level.upper()}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


def configure_logging(log_format: str, level: str, process_label: str = "http") -> None:
    """Applies :func:`log_config` to this process."""
    logging.config.dictConfig(log_config(log_format, level, process_label))
    logging.captureWarnings(True)
