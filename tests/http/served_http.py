"""`breeze-worker serve --http-port 0` as a subprocess (tiny default model, CPU): the integration tests' served
worker (tests/integration/served_worker.py) with its HTTP face, found from its log line
`HTTP face on http://HOST:PORT/`.

    with ServedHttp(tmp_path, "--token", "T") as worker:
        worker.url("/health"), worker.target, worker.artifact_target, worker.metrics_port
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from served_worker import ServedWorker  # noqa: E402

HTTP_LINE = re.compile(r"HTTP face on (https?)://(\S+):(\d+)/")


class ServedHttp(ServedWorker):
    def __init__(self, artifact_dir: Path, *args: str) -> None:
        super().__init__(artifact_dir, "--http-port", "0", *args)
        self.base = ""

    def __enter__(self) -> ServedHttp:
        super().__enter__()  # the ready line: both gRPC ports listen and the model is warm
        deadline = time.monotonic() + 60  # the HTTP line is logged before the ready line: this only bounds a bug
        while not (found := HTTP_LINE.search(self.stderr_text())):
            if time.monotonic() > deadline:
                self.__exit__()
                raise AssertionError(f"no HTTP face line; stderr: {self.stderr_text()[-3000:]}")
            time.sleep(0.05)
        self.base = f"{found.group(1)}://{found.group(2)}:{found.group(3)}"
        return self

    def url(self, path: str) -> str:
        return self.base + path

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics_host}:{self.metrics_port}/metrics"
