"""What a peer without the token, or an idle one, can make a worker process hold, probed from outside over real
sockets: thousands of health watchers (open by design) stop at --health-max-watchers, the rest refused at once
with RESOURCE_EXHAUSTED; calls that never send their request message end after --first-message-timeout-s;
connections that never finish their handshake, and idle ones, are closed; hundreds of silent connections to the
metrics port do not stop a scrape; token guesses from one address are throttled and logged in aggregate, and a
token shorter than the minimum is refused at start-up. The worker's resident memory is read from /proc before,
at the peak and after, and printed; while all this is open an authenticated client synthesizes as usual."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from served import ENV, ServedWorker

from breeze_client.errors import InvalidArgument
from breeze_client.sdk import BreezeClient
from breeze_tts_proto.v1 import synthesis_pb2, synthesis_pb2_grpc

TOKEN = "a-long-enough-test-token-0123456789"
WATCHERS = 20_000  # opened; the worker serves --health-max-watchers of them
MAX_WATCHERS = 1024  # the default
SILENT_CALLS = 2_000
MAX_WAITING = 64  # --max-waiting-calls-per-peer's default
WAVE = 50
STREAMS_PER_CHANNEL = 100  # under --max-streams-per-connection (128): a channel would queue the rest itself
MIB = 1024 * 1024
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")  # + an empty SETTINGS


def rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    served = ServedWorker(tmp_path_factory.mktemp("artifacts"), "--token", TOKEN, "--first-message-timeout-s", "5",
                          "--handshake-timeout-s", "2", "--max-connection-idle-s", "2", host="localhost").start()
    yield served
    served.stop()


async def _watch(stub, answered: asyncio.Semaphore, release: asyncio.Event) -> str:
    """One Watch: 'served' once its first status came, held until `release` ('ended CODE' when the worker ended
    it meanwhile); else its status code's name.
    `answered` is released once the worker answered it either way."""
    call = stub.Watch(health_pb2.HealthCheckRequest(service=""))
    try:
        first = await call.read()
        if first is grpc.aio.EOF:
            return (await call.code()).name
        answered.release()
        await release.wait()
        return f"ended {(await call.code()).name}" if call.done() else "served"
    except grpc.aio.AioRpcError as err:
        return err.code().name
    finally:
        if not call.done():
            call.cancel()
        else:
            answered.release()


async def _silent_call(channel: grpc.aio.Channel) -> tuple[str, str]:
    """A call to an open unary method that never sends its message: its status code and message."""
    call = channel.stream_stream("/grpc.health.v1.Health/Check")()
    try:
        await call.read()
        return (await call.code()).name, await call.details()
    except grpc.aio.AioRpcError as err:
        return err.code().name, err.details() or ""


def _scrape(worker: ServedWorker) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=30) as response:
        assert b"breeze_frames_total" in response.read()
        return response.status


def _health_watchers(worker: ServedWorker) -> float:
    """The worker's `breeze_health_watchers` gauge."""
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("breeze_health_watchers "):
                return float(line.split()[1])
    raise AssertionError("no breeze_health_watchers in the metrics")


def test_thousands_of_watchers_and_silent_calls_hold_a_bounded_amount_of_memory(worker):
    pid = worker.proc.pid
    # the warm-up from a process of its own: a closed client's health watch stays open on the worker while its
    # process lives (gRPC keeps the subchannel), and would hold one of the flood's places; it ends with the
    # process, once the worker has handled the closed connection (late on a busy host)
    code = ("import sys\nfrom breeze_client import BreezeClient\n"
            "with BreezeClient(sys.argv[1], token=sys.argv[2], timeout_s=120) as client:\n"
            "    client.synthesize('Warm.', max_frames=4, seed=1)\n")
    subprocess.run([sys.executable, "-c", code, f"127.0.0.1:{worker.port}", TOKEN], check=True, timeout=300)
    deadline = time.monotonic() + 120  # a hang guard only
    while _health_watchers(worker) != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _health_watchers(worker) == 0
    before = rss(pid)

    async def flood() -> tuple[list, Counter, int]:
        options = [("grpc.use_local_subchannel_pool", 1)]  # a connection each
        # calls that never send their message: MAX_WAITING wait (until --first-message-timeout-s), the rest are
        # refused at once
        silent_channels = [grpc.aio.insecure_channel(f"127.0.0.1:{worker.artifact_port}", options=options)
                           for _ in range(SILENT_CALLS // STREAMS_PER_CHANNEL)]
        silent = await asyncio.gather(*(_silent_call(silent_channels[i % len(silent_channels)])
                                        for i in range(SILENT_CALLS)))
        # health watchers, opened in waves of fewer than MAX_WAITING (each waits for its message a moment)
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}", options=options)
                    for _ in range(WATCHERS // STREAMS_PER_CHANNEL)]
        release, answered = asyncio.Event(), asyncio.Semaphore(0)
        watches = []
        for wave in range(0, WATCHERS, WAVE):
            watches += [asyncio.create_task(_watch(health_pb2_grpc.HealthStub(channels[i % len(channels)]),
                                                   answered, release)) for i in range(wave, wave + WAVE)]
            for _ in range(WAVE):
                await asyncio.wait_for(answered.acquire(), 300)
        peak = rss(pid)
        # a client with the token, on another address, is served while the watchers are open (its channel's own
        # health watcher takes the place of one of the flood's)
        synthesized = await asyncio.to_thread(lambda: BreezeClient(f"ipv6:[::1]:{worker.port}", token=TOKEN,
                                                                   timeout_s=120)
                                              .synthesize("Served while flooded.", max_frames=4, seed=2))
        assert synthesized.artifact is not None
        release.set()
        outcomes = Counter(await asyncio.gather(*watches))
        for channel in channels + silent_channels:
            await channel.close()
        return silent, outcomes, peak

    silent, outcomes, peak = asyncio.run(flood())
    assert _scrape(worker) == 200
    after = rss(pid)
    print(f"\nworker RSS: before {before / MIB:.1f} MiB; after {SILENT_CALLS} calls without a message, with "
          f"{MAX_WATCHERS} health watchers open and {WATCHERS - MAX_WATCHERS} refused {peak / MIB:.1f} MiB "
          f"(+{(peak - before) / MIB:.1f}); at the end {after / MIB:.1f} MiB (+{(after - before) / MIB:.1f})")
    # of the calls without a message, MAX_WAITING waited for it until --first-message-timeout-s; the others
    # were refused at once, by the worker or by gRPC's own bound on calls not yet handed to the server
    codes = Counter(code for code, _ in silent)
    assert codes["DEADLINE_EXCEEDED"] == MAX_WAITING and set(codes) <= {"DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED",
                                                                        "CANCELLED"}, codes
    assert all("did not arrive within 5 s" in details for code, details in silent if code == "DEADLINE_EXCEEDED")
    assert worker.wait_logged("calls refused before their message: 64 calls of this address wait for their request "
                              "message (--max-waiting-calls-per-peer) (peer 127.0.0.1)")
    assert outcomes == Counter({"served": MAX_WATCHERS - 1, "ended RESOURCE_EXHAUSTED": 1,
                                "RESOURCE_EXHAUSTED": WATCHERS - MAX_WATCHERS}), outcomes
    assert worker.wait_logged("health watchers refused: 1024 watchers are open (--health-max-watchers), most of "
                              "them this peer's (peer 127.0.0.1)")
    assert worker.wait_logged("health watchers ended for another peer's: ")
    # unbounded (--health-max-watchers 30000), 10,000 watchers held 260 MB more
    assert peak - before < 128 * MIB


def test_connections_that_never_handshake_or_go_idle_are_closed(worker):
    before = rss(worker.proc.pid)
    silent = [socket.create_connection(("127.0.0.1", worker.port), timeout=120) for _ in range(500)]
    idle = socket.create_connection(("127.0.0.1", worker.artifact_port), timeout=120)
    idle.sendall(H2_PREFACE)  # an HTTP/2 connection that opens no call
    try:
        for s in silent[:5] + [idle]:  # each is closed by the worker: its read ends
            received = b""
            while chunk := s.recv(65536):
                received += chunk
            assert s is not idle or received.startswith(b"\x00"), received[:20]  # the server's frames, then EOF
        peak = rss(worker.proc.pid)
    finally:
        for s in silent + [idle]:
            s.close()
    print(f"\nworker RSS: before {before / MIB:.1f} MiB, 500 connections without a handshake {peak / MIB:.1f} MiB")


def test_the_metrics_port_answers_scrapes_with_hundreds_of_silent_connections_open(worker):
    silent = []
    for n in range(600):  # from 40 addresses, more than --metrics-max-connections (256) in all
        s = socket.socket()
        s.bind((f"127.0.0.{2 + n % 40}", 0))
        s.connect(("127.0.0.1", worker.metrics_port))
        silent.append(s)
    try:
        for _ in range(5):
            assert _scrape(worker) == 200
    finally:
        for s in silent:
            s.close()


def test_token_guessing_is_throttled_per_address_and_logged_in_aggregate(tmp_path):
    worker = ServedWorker(tmp_path / "artifacts", "--token", TOKEN, "--auth-max-failures", "5",
                          "--auth-failure-refill-s", "600", host="localhost").start()
    try:
        def info(target: str, token: str) -> str:
            with grpc.insecure_channel(target) as channel:
                try:
                    synthesis_pb2_grpc.SynthesisStub(channel).GetWorkerInfo(
                        synthesis_pb2.GetWorkerInfoRequest(), metadata=(("authorization", f"Bearer {token}"),),
                        timeout=60)
                    return "OK"
                except grpc.RpcError as err:
                    return err.code().name

        guesser = f"127.0.0.1:{worker.port}"
        codes = [info(guesser, f"guess-{n:04d}-of-the-token") for n in range(200)]
        assert codes == ["UNAUTHENTICATED"] * 5 + ["RESOURCE_EXHAUSTED"] * 195
        assert info(guesser, TOKEN) == "RESOURCE_EXHAUSTED"  # the right token is not told apart while throttled
        assert info(f"ipv6:[::1]:{worker.port}", TOKEN) == "OK"  # another address is not affected
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(guesser))  # health stays open to the guesser
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=60).status == \
            health_pb2.HealthCheckResponse.SERVING
        assert worker.wait_logged("calls refused after too many failed authentications: over 5 failed attempts")
        refusals = [line for line in worker.log if "calls refused" in line]
        assert len(refusals) == 2, refusals  # the first of each kind; the rest are counted for the next summary
    finally:
        worker.stop()


def test_a_token_shorter_than_the_minimum_is_refused_at_start_up(tmp_path):
    done = subprocess.run(ServedWorker(tmp_path / "artifacts", "--token", "x" * 15).command(), env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "the bearer token is 15 characters; use at least 16" in done.stderr
    assert not (tmp_path / "artifacts").exists()  # refused before anything was made


def test_a_text_of_only_zero_width_characters_is_refused(worker):
    with BreezeClient(f"127.0.0.1:{worker.port}", token=TOKEN, timeout_s=120) as client:
        with pytest.raises(InvalidArgument, match="text has no visible character"):
            client.synthesize("\u200b\u200c\u200d\u2060\ufeff" * 10)
        assert client.synthesize("Visible \u200bwords.", max_frames=4, seed=1).artifact is not None
