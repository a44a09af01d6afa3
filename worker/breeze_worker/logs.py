"""Worker logging: configured once by the entry point, one record per line, client strings bounded and escaped.

`configure(level, fmt)` installs the one handler (stderr) in the text or the JSON format. It writes from a
thread of its own (`BackgroundHandler`): no thread that logs ever waits on whoever reads stderr. Per-call fields
(`job_id`, `request_id`, `method`, `peer`) live in a context variable: the transport binds the method,
peer and request id for each call and the engine adds the job id, so every line a call logs carries them
(a record from the engine thread gets its job id from the job id it names). Both formats escape control
characters in every message and field (a newline becomes the two characters `\\n`) and cut each to a
bound, so a client-supplied string can neither forge a record nor flood the log. Text tracebacks keep
their lines, indented, so only a record's first line starts at column 0.

Importable from every layer (it imports nothing of ours), like `breeze_worker.errors`.
"""

from __future__ import annotations

import collections
import contextvars
import json
import logging
import re
import sys
import threading
import time
from datetime import UTC, datetime

FORMATS = ("text", "json")
FIELDS = ("job_id", "request_id", "method", "peer")
MAX_FIELD_CHARS = 128  # a job id, a request id, a method name or a peer address
MAX_MESSAGE_CHARS = 4096
MAX_TRACEBACK_LINES = 200

QUEUED_LINES = 10_000  # lines held while stderr is not being read; past that, records are dropped and counted
FLUSH_WAIT_S = 2.0  # how long flush() (and so the exit) waits for the held lines to be written

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


class BackgroundHandler(logging.Handler):
    """Formats each record in the thread that logs it (so its per-call fields are that call's) and writes the
    lines to `stream` from a thread of its own.

    Why: with a plain stream handler every thread that logs writes to stderr itself, and a write blocks while
    the pipe is full. A pipe nobody reads, or a container runtime's log driver in blocking mode that falls
    behind, would stop the event loop (every call) or the engine thread (every stream) at its next line.
    Here, while the writer is stuck, up to `capacity` lines wait; past that, records are dropped and counted
    (`dropped`), and a WARNING line where the gap is says how many. `flush()` waits up to FLUSH_WAIT_S for
    what is held, so the lines logged before a normal exit are written."""

    def __init__(self, stream, capacity: int = QUEUED_LINES) -> None:
        super().__init__()
        self.stream = stream
        self.capacity = capacity
        self.dropped = 0  # records dropped since the start
        self._gap = 0  # records dropped since the last line held
        self._held: collections.deque[str] = collections.deque()
        self._writing = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:  # called with the handler's lock held
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - logging's own policy for a record that cannot be formatted
            self.handleError(record)
            return
        with self._cond:
            needed = 2 if self._gap else 1  # after a gap, its line goes first
            if self._closed or self.capacity - len(self._held) < needed:
                self._gap += 1
                self.dropped += 1
                return
            if self._gap:
                self._held.append(self._gap_line(self._gap))
                self._gap = 0
            self._held.append(line)
            self._cond.notify()

    def _gap_line(self, count: int) -> str:
        note = logging.LogRecord("breeze_worker.logs", logging.WARNING, __file__, 0,
                                 "%d log records dropped here: the log output (stderr) was not read fast enough",
                                 (count,), None)
        return contextvars.Context().run(self.format, note)  # no call's fields: it belongs to no call

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._held and not self._closed:
                    self._cond.wait()
                if not self._held:
                    return
                lines = list(self._held)
                self._held.clear()
                if self._gap:  # records were dropped after the last of these lines (none was held since)
                    lines.append(self._gap_line(self._gap))
                    self._gap = 0
                self._writing = True
            try:
                self.stream.write("".join(line + "\n" for line in lines))
                self.stream.flush()
            except (OSError, ValueError):  # the reader went away (EPIPE) or the stream was closed
                with self._cond:
                    self.dropped += len(lines)
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()

    def flush(self) -> None:
        deadline = time.monotonic() + FLUSH_WAIT_S
        with self._cond:
            while self._held or self._writing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        super().close()


def flush() -> None:
    """Write what the handler still holds: before a command prints its last line to stderr itself, so the log's
    lines and that line do not interleave (the handler writes from a thread of its own)."""
    for handler in logging.getLogger().handlers:
        handler.flush()


def dropped_records() -> int:
    """Records the installed handler dropped because stderr was not read fast enough (0 before configure)."""
    root = logging.getLogger()
    return sum(h.dropped for h in root.handlers if isinstance(h, BackgroundHandler))


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Install the one stderr handler on the root logger (replacing any), in `fmt` ('text' or 'json')."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    numeric = logging.getLevelName(str(level).upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not {level!r}")
    handler = BackgroundHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, BackgroundHandler):  # ours from an earlier configure: write what it holds, stop
            old.close()
    root.addHandler(handler)
    root.setLevel(numeric)
    logging.captureWarnings(True)  # Python warnings become records of the `py.warnings` logger
    _route_library_loggers()


def _route_library_loggers() -> None:
    """transformers installs a stderr handler of its own ('[transformers] message', not propagated): remove
    it, so its records reach the one handler above in the chosen format. Only once transformers is imported
    (importing it costs a start-up much; the reference encoder, which imports it, calls `route_transformers`)."""
    if "transformers" in sys.modules:
        route_transformers()


def route_transformers() -> None:
    """transformers' log records through this process's handler (see `_route_library_loggers`)."""
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:  # the worker's model code is not installed: nothing to route
        return
    transformers_logging.disable_default_handler()
    transformers_logging.enable_propagation()
