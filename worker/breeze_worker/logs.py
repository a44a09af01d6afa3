"""Worker logging: configured once by the entry point, one record per line, client strings bounded and escaped.

`configure(level, fmt)` installs the one handler (stderr) in the text or the JSON format. Per-call fields
(`job_id`, `request_id`, `method`, `peer`) live in a context variable: the transport binds the method,
peer and request id for each call and the engine adds the job id, so every line a call logs carries them
(a record from the engine thread gets its job id from the job id it names). Both formats escape control
characters in every message and field (a newline becomes the two characters `\\n`) and cut each to a
bound, so a client-supplied string can neither forge a record nor flood the log. Text tracebacks keep
their lines, indented, so only a record's first line starts at column 0.

Importable from every layer (it imports nothing of ours), like `breeze_worker.errors`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
from datetime import UTC, datetime

FORMATS = ("text", "json")
FIELDS = ("job_id", "request_id", "method", "peer")
MAX_FIELD_CHARS = 128  # a job id, a request id, a method name or a peer address
MAX_MESSAGE_CHARS = 4096
MAX_TRACEBACK_LINES = 200

_JOB_ID = re.compile(r"job-[0-9a-f]{24}")  # engine.service.new_job_id()
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_fields: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("breeze_log_fields")


def clip(value: object, limit: int = MAX_FIELD_CHARS) -> str:
    """`value` as one printable line: non-printable characters escaped, cut after `limit` characters with a
    note of how many were left out (so a 4 MB string costs a few hundred bytes of log)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit and text.isprintable():
        return text
    cut, rest = text[:limit], len(text) - limit
    escaped = "".join(ch if ch.isprintable() or ch == " " else _escape(ch) for ch in cut)
    return escaped + (f"...(+{rest} characters)" if rest > 0 else "")


def _escape(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def bind(**fields: object) -> None:
    """Add per-call fields (job_id, request_id, method, peer) to the current task's log context."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown log fields {sorted(unknown)}: use {FIELDS}")
    current = dict(_fields.get({}))
    current.update({k: clip(v) for k, v in fields.items() if v not in (None, "")})
    _fields.set(current)


def fields_of(record: logging.LogRecord) -> dict[str, str]:
    """The record's per-call fields: `extra=` values first, then the context, then a job id named in its args."""
    found = dict(_fields.get({}))
    for name in FIELDS:
        value = getattr(record, name, None)
        if value:
            found[name] = clip(value)
    if "job_id" not in found:
        args = record.args if isinstance(record.args, tuple) else ()
        job = next((a for a in args if isinstance(a, str) and _JOB_ID.fullmatch(a)), None)
        if job is not None:
            found["job_id"] = job
    return found


def _traceback_lines(formatter: logging.Formatter, record: logging.LogRecord) -> list[str]:
    text = ""
    if record.exc_info:
        text = formatter.formatException(record.exc_info)
    elif record.exc_text:
        text = record.exc_text
    if record.stack_info:
        text = (text + "\n" if text else "") + record.stack_info
    lines = text.splitlines()
    if len(lines) > MAX_TRACEBACK_LINES:
        half = MAX_TRACEBACK_LINES // 2
        lines = lines[:half] + [f"...({len(lines) - 2 * half} lines left out)"] + lines[-half:]
    return [clip(line, MAX_MESSAGE_CHARS) for line in lines]


class TextFormatter(logging.Formatter):
    """`time LEVEL logger message [job_id=... request_id=... method=... peer=...]`, tracebacks indented."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        message = clip(record.getMessage(), MAX_MESSAGE_CHARS)
        found = fields_of(record)
        if found:
            message += " [" + " ".join(f"{k}={found[k]}" for k in FIELDS if k in found) + "]"
        record.asctime = self.formatTime(record)
        line = f"{record.asctime} {record.levelname} {record.name} {message}"
        return "\n".join([line] + ["    " + part for part in _traceback_lines(self, record)])


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the per-call fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": clip(record.getMessage(), MAX_MESSAGE_CHARS),
        }
        found = fields_of(record)
        obj.update({k: found[k] for k in FIELDS if k in found})
        lines = _traceback_lines(self, record)
        if lines:
            obj["exception"] = "\n".join(lines)
        return json.dumps(obj, ensure_ascii=False)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Install the one stderr handler on the root logger (replacing any), in `fmt` ('text' or 'json')."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    numeric = logging.getLevelName(str(level).upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    logging.captureWarnings(True)  # Python warnings become records of the `py.warnings` logger
    _route_library_loggers()


def _route_library_loggers() -> None:
    """transformers installs a stderr handler of its own ('[transformers] message', not propagated): remove
    it, so its records reach the one handler above in the chosen format."""
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:  # the worker's model code is not installed: nothing to route
        return
    transformers_logging.disable_default_handler()
    transformers_logging.enable_propagation()
