"""A synthesis stream consumed in a background thread, so a test can act (fill a disk, send a signal) while
jobs run, then check what each caller got."""

from __future__ import annotations

import threading
import time

from breeze_client.errors import BreezeClientError
from breeze_client.sdk import BreezeClient


class StreamInThread(threading.Thread):
    def __init__(self, client: BreezeClient, text: str, **options) -> None:
        super().__init__(daemon=True)
        self.stream = client.stream(text, **options)
        self.chunks = 0
        self.audio = bytearray()
        self.result = None
        self.error: BreezeClientError | None = None
        self.start()

    def run(self) -> None:
        try:
            for chunk in self.stream:
                self.chunks += 1
                self.audio += chunk.pcm
            self.result = self.stream.result
        except BreezeClientError as exc:
            self.error = exc

    @property
    def job(self):
        return self.stream.job

    def wait_for(self, chunks: int = 0, timeout_s: float = 120) -> None:
        """Until the job started and `chunks` chunks arrived (fails if the stream ended first)."""
        deadline = time.monotonic() + timeout_s
        while self.job is None or self.chunks < chunks:
            assert self.is_alive() or self.result is not None, f"the stream ended early: {self.error}"
            assert time.monotonic() < deadline, f"no start / {chunks} chunks in {timeout_s} s"
            time.sleep(0.02)

    def finish(self, timeout_s: float = 300):
        self.join(timeout_s)
        assert not self.is_alive(), "the stream did not end"
        return self.result
