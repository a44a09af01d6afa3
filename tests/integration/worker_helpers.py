"""What the integration tests share besides their worker (tests/inprocess_worker.py): the request size
limit their workers take and the check that a worker still serves after a rejected request."""

from __future__ import annotations

from breeze_client.sdk import BreezeClient

MAX_REQUEST_BYTES = 256 * 1024


def assert_still_serving(client: BreezeClient) -> None:
    """The worker answers health and runs a short job after a rejected request."""
    assert client.health() == "SERVING"
    result = client.synthesize("Still here.", max_frames=2, seed=1)
    assert result.stats.frames >= 1 and result.artifact is not None
