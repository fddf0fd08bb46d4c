"""Log lines as text or as JSON objects, one notable event a line.

Context about a request travels in the record's ``extra`` (``request_id``, ``model``); both
formats print it, so a request's lines can be found by its id.
"""

from __future__ import annotations

import json
import logging
import time

# Attributes every LogRecord has; anything else on a record came in through ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "message": ..., <extras>}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        entry.update(_extras(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """The usual line, with any extras appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        return line + "".join(f" {k}={v}" for k, v in extras.items()) if extras else line


def configure_logging(level: str, log_format: str) -> None:
    """One handler on the root logger, to stderr, in ``log_format`` ("text" or "json")."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
