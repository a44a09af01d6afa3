"""The worker's log formats: one record per line whatever a client sends, bounded, with the per-call fields."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import pytest

from breeze_worker import logs


def _record(msg: str, *args, exc_info=None, **extra) -> logging.LogRecord:
    record = logging.LogRecord("breeze_worker.test", logging.INFO, __file__, 1, msg, args, exc_info)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


FORGED = "abc\n2026-01-01 00:00:00,000 ERROR breeze_worker.serve forged record\r\x1b[2Jand\u2028more"


def test_clip_escapes_control_characters_and_bounds_length():
    assert logs.clip("job-1 ok") == "job-1 ok"
    escaped = logs.clip(FORGED)
    assert "\n" not in escaped and "\r" not in escaped and "\x1b" not in escaped and "\u2028" not in escaped
    assert "abc\\n2026-01-01" in escaped and "\\x1b[2J" in escaped and "\\u2028" in escaped
    huge = logs.clip("x" * (4 << 20))
    assert len(huge) < 200 and huge.endswith(f"...(+{(4 << 20) - logs.MAX_FIELD_CHARS} characters)")
    assert "".join(logs.clip(c) for c in "中文 text") == "中文 text"  # printable text is kept as it is


@pytest.mark.parametrize("formatter", [logs.TextFormatter(), logs.JsonFormatter()], ids=["text", "json"])
def test_a_client_string_in_a_message_or_a_field_stays_on_one_bounded_line(formatter):
    line = formatter.format(_record("request %s rejected", FORGED + "y" * (4 << 20), request_id=FORGED))
    assert "\n" not in line and "\r" not in line and "\u2028" not in line
    assert len(line) < logs.MAX_MESSAGE_CHARS + 1000
    assert line.splitlines() == [line]  # nothing str.splitlines() would split on either


def test_json_records_carry_the_bound_call_fields():
    async def call():
        logs.bind(method="/breeze.tts.v1.Synthesis/Synthesize", peer="ipv4:127.0.0.1:5000", request_id="r-1")
        logs.bind(job_id="job-" + "ab" * 12)
        return json.loads(logs.JsonFormatter().format(_record("job queued")))

    obj = asyncio.run(call())
    assert obj["message"] == "job queued" and obj["level"] == "INFO" and obj["logger"] == "breeze_worker.test"
    assert obj["method"] == "/breeze.tts.v1.Synthesis/Synthesize" and obj["peer"] == "ipv4:127.0.0.1:5000"
    assert obj["request_id"] == "r-1" and obj["job_id"] == "job-" + "ab" * 12
    # another task (another call) does not see them
    outside = json.loads(logs.JsonFormatter().format(_record("idle")))
    assert not set(logs.FIELDS) & set(outside)
    with pytest.raises(ValueError, match="unknown log fields"):
        logs.bind(user="x")


def test_an_engine_thread_record_gets_the_job_id_it_names():
    job = "job-" + "0f" * 12
    obj = json.loads(logs.JsonFormatter().format(_record("job %s: artifact commit failed", job)))
    assert obj["job_id"] == job
    text = logs.TextFormatter().format(_record("job %s failed", job))
    assert text.endswith(f"job {job} failed [job_id={job}]")


def test_tracebacks_are_indented_in_text_and_one_field_in_json():
    try:
        raise RuntimeError("boom\nforged 2026-01-01 line")
    except RuntimeError:
        exc_info = sys.exc_info()
    text = logs.TextFormatter().format(_record("call failed", exc_info=exc_info))
    first, *rest = text.split("\n")
    assert first.endswith("call failed") and rest and all(line.startswith("    ") for line in rest)
    assert any("RuntimeError: boom" in line for line in rest)
    obj = json.loads(logs.JsonFormatter().format(_record("call failed", exc_info=exc_info)))
    assert "RuntimeError: boom" in obj["exception"] and "Traceback" in obj["exception"]


def test_configure_installs_one_handler_and_refuses_unknown_settings():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.configure("warning", "json")
        logs.configure("info", "json")  # again: still one handler
        ours = [h for h in root.handlers if isinstance(h.formatter, logs.JsonFormatter)]
        assert len(ours) == 1 and root.level == logging.INFO
        assert logging.getLogger("transformers").propagate  # its records reach our handler
        with pytest.raises(ValueError, match="log format"):
            logs.configure("INFO", "xml")
        with pytest.raises(ValueError, match="log level"):
            logs.configure("LOUD", "text")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def _pipe_handler(capacity: int):
    """A BackgroundHandler writing JSON lines into a real OS pipe; returns (handler, read end)."""
    import os

    read_end, write_end = os.pipe()
    handler = logs.BackgroundHandler(os.fdopen(write_end, "w"), capacity=capacity)
    handler.setFormatter(logs.JsonFormatter())
    return handler, read_end


def _drain(read_end: int, handler, then=None) -> list[dict]:
    """Empty the pipe from now on, let the handler write what it holds, log `then` (a message), close the
    handler; the records read, in order."""
    import os
    import threading

    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_end, 65536), b"")))
    reader.start()
    handler.flush()
    if then is not None:
        handler.handle(_record(then))
    handler.close()
    handler.stream.close()
    reader.join(30)
    os.close(read_end)
    return [json.loads(line) for line in b"".join(chunks).decode().splitlines()]


def test_a_log_nobody_reads_never_blocks_the_caller_and_says_what_it_dropped():
    """20,000 records into a pipe nobody reads: every call returns (a plain stream handler would block at the
    first line that did not fit); what did not fit is dropped, counted, and named by one line at each gap."""
    import threading

    handler, read_end = _pipe_handler(capacity=100)
    done = threading.Event()

    def log_many():
        for i in range(20_000):
            handler.handle(_record("record %d", i))
        done.set()

    threading.Thread(target=log_many, daemon=True).start()
    assert done.wait(60), "logging blocked on a pipe nobody reads"
    dropped = handler.dropped
    assert dropped > 0
    records = _drain(read_end, handler, then="after the gap")
    expected, notices = 0, 0  # each record in order, and at each gap one line saying how many records it holds
    for record in records[:-1]:
        message = record["message"]
        if message.startswith("record "):
            assert message == f"record {expected}"
            expected += 1
        else:
            count = int(message.split()[0])
            assert record["level"] == "WARNING" and message.startswith(f"{count} log records dropped here")
            assert "job_id" not in record and "request_id" not in record
            expected, notices = expected + count, notices + count
    assert expected == 20_000 and notices == dropped
    assert records[-1]["message"] == "after the gap"


def test_lines_are_formatted_in_the_calling_context_and_written_at_close():
    handler, read_end = _pipe_handler(capacity=1000)

    async def call(i: int):
        logs.bind(request_id=f"r-{i}")
        handler.handle(_record("job queued"))

    async def main():
        await asyncio.gather(*(call(i) for i in range(50)))

    asyncio.run(main())
    records = _drain(read_end, handler)  # close(): the held lines are written first
    assert [r["request_id"] for r in records] == [f"r-{i}" for i in range(50)]
    assert handler.dropped == 0
