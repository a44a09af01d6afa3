"""Every command README.md shows, run as a newcomer would run it.

The commands are read from the README's ```bash blocks (its ```python block, the SDK example, too) and each must
appear in `HOW` below, which says how it runs here, so a command added to the README without a test fails
`test_every_readme_command_is_checked_here`. A command runs as written, in its own process, with:

- what this machine lacks swapped in (`SWAPS`): the CPU for `--device cuda`, the tiny architecture for
  `--size full`, a synthetic checkpoint written here for /models/Breeze-TTS-2, a temporary directory for the
  artifact directory, espeak-ng's speech for `me.wav`, an artifact the worker made for `art-0123...`;
- flags that only make the work smaller where a command would run for minutes on 2 cores (`Run.smaller`);
- the worker its own README line starts (`breeze-worker serve --model ...`, on free ports) named by
  BREEZE_TARGET, the variable every `breeze-client` command reads, so the commands need no --target.

`scripts/test.sh` is this suite itself (CI runs it through .ci/run); the `python benchmarks/...` lines are
checked flag by flag against the tool's own `--help` (tests/benchmarks and tests/test_serve_bench.py run each
tool on the CPU).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import soundfile as sf
from host_tools import need_tool

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")),
           PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
READY = re.compile(r"breeze-worker ready: synthesis=(\S+) artifacts=(\S+) model=(.+)")
SERVE = "breeze-worker serve --model /models/Breeze-TTS-2 --device cuda:0 --artifact-dir /var/lib/breeze/artifacts"
SERVE_HTTP = "breeze-worker serve --model /models/Breeze-TTS-2 --http-port 7860"
HTTP_LINE = re.compile(r"HTTP face on http://\S+:(\d+)/")

# what this machine lacks -> what stands in for it (`{name}`: a path or id the fixtures made)
SWAPS = {"/models/Breeze-TTS-2": "{checkpoint}", "--device cuda:0": "--device cpu", "--device cuda": "--device cpu",
         "--size full": "--size tiny", "/var/lib/breeze/artifacts": "{artifacts}", "art-0123...": "{artifact}",
         "--ref-audio me.wav": "--ref-audio {voice}", "--http-port 7860": "--http-port 0",
         "http://127.0.0.1:7860": "{http_base}"}


@dataclass(frozen=True)
class Run:
    """Run the command (with SWAPS), from the repository (`at_root`) or a scratch directory; it must exit 0 and
    leave `writes` there, and its output must hold `says`."""

    smaller: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    says: tuple[str, ...] = ()
    at_root: bool = False


@dataclass(frozen=True)
class Flags:
    """A benchmark tool: each flag of the command is one its `--help` documents."""


@dataclass(frozen=True)
class Elsewhere:
    why: str = ""


@dataclass(frozen=True)
class Served:
    """The worker the other commands reach (the `served` fixture starts it)."""


@dataclass(frozen=True)
class ServedHttp:
    """The worker with its HTTP face that the `curl` line reaches (the `served_http` fixture starts it)."""


HOW: dict[str, Run | Flags | Elsewhere | Served | ServedHttp] = {
    "scripts/quickstart.sh": Run(at_root=True, says=("the streamed audio and the fetched artifact are identical",)),
    "scripts/test.sh": Elsewhere("it runs this suite: CI runs it (.ci/run)"),
    SERVE: Served(),
    'breeze-client synth "Good morning." --stream -o morning.wav': Run(writes=("morning.wav",),
                                                                        says=("TTFA", "art-")),
    'breeze-client synth "Softly now." --instruction "Whisper." --cfg-scale 1.5 --seed 7 -o soft.wav':
        Run(writes=("soft.wav",), says=("seed 7", "template instruction")),
    'breeze-client synth "Same voice." --ref-audio me.wav --ref-text "exact words in me.wav" -o me2.wav':
        Run(writes=("me2.wav",), says=("reference",)),
    'breeze-client synth "Slower now." --ref-audio me.wav --ref-text "exact words in me.wav" --instruction '
    '"Slow and calm." --cfg-scale-reference 1.5 --cfg-scale-instruction 2 -o directed.wav':
        Run(writes=("directed.wav",), says=("guidance: reference 1.5, instruction 2",)),
    SERVE_HTTP: ServedHttp(),
    'curl -X POST http://127.0.0.1:7860/v1/audio/speech -F "text=Hello." -F "seed=42" --output hello.pcm':
        Run(writes=("hello.pcm",)),
    "breeze-client fetch art-0123... -o job.wav --compression zstd": Run(writes=("job.wav",),
                                                                        says=("sha256 verified",)),
    "breeze-client health": Run(says=("SERVING", "NOT speech")),
    "breeze-client diagnose -n 3 --report retrieval.html": Run(smaller=("--max-frames", "8"),
                                                               writes=("retrieval.html",), says=("fix",)),
    "breeze-client bench --concurrency 8 --cfg-every 2 --json bench.json":
        Run(smaller=("--labels", "short", "--frames", "2", "--warmup", "0", "--iterations", "1"),
            writes=("bench.json",)),
    "breeze-worker bench --size full --device cuda --paths eager,fast --json engine.json":
        Run(smaller=("--frames", "2", "--repeats", "1", "--cfg", "off"), writes=("engine.json",)),
    "breeze-worker bench --size full --device cuda --concurrency 1,8,32,64 --json sweep.json":
        Run(smaller=("--frames", "2"), writes=("sweep.json",)),
    "breeze-worker trace --path fast --frames 6 --trace trace.json": Run(writes=("trace.json",)),
    "breeze-worker audit-syncs --path both --budget 1": Run(says=("budget 1: ok", "reported only")),
    "breeze-worker precision-check --model /models/Breeze-TTS-2 --json precision.json":
        Run(smaller=("--frames", "2"), writes=("precision.json",)),
    "python benchmarks/serve_bench.py --make-checkpoint full --device cuda": Flags(),
    "python benchmarks/host_overhead.py --streams 32,64": Flags(),
    "python benchmarks/request_intake.py --tree ../older": Flags(),
    "python benchmarks/guidance_cost.py --tree ../baseline --json guidance.json": Flags(),
    "python benchmarks/startup_bench.py --make-checkpoint full --streams 8 --baseline-tree ../older": Flags(),
    "python benchmarks/group_commit.py --dir /artifact/volume/bench": Flags(),
    "python benchmarks/device_run.py --steps gpu-tests,engine-bench,sweep --out DIR --commit SHA": Flags(),
}


def _without_comment(line: str) -> str:
    """The line up to a `#` that starts a shell comment (outside quotes, after a space)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.M | re.S)


def readme_commands() -> list[str]:
    """Each command of the README's bash blocks, in order (continuations joined, comments dropped)."""
    commands: list[str] = []
    for block in _blocks("bash"):
        pending = ""
        for raw in block.splitlines():
            line = _without_comment(raw)
            if line.endswith("\\"):
                pending += line[:-1].strip() + " "
                continue
            line, pending = (pending + line.strip()).strip(), ""
            if line and line != ". .venv/bin/activate":
                commands.append(line)
    return commands


def test_every_readme_command_is_checked_here():
    commands = readme_commands()
    assert len(commands) == len(set(commands)) and commands, commands
    assert set(commands) - set(HOW) == set(), "README commands this test does not know: add them to HOW"
    assert set(HOW) - set(commands) == set(), "HOW names commands the README no longer shows"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, str]:
    """The stand-ins: a synthetic checkpoint (tiny, in the official layout), an artifact directory and a voice."""
    import torch

    from breeze_worker.model.synthetic import write_synthetic_checkpoint

    root = tmp_path_factory.mktemp("readme")
    checkpoint = write_synthetic_checkpoint(root / "Breeze-TTS-2", "tiny", seed=0, dtype=torch.float32)
    voice = root / "me.wav"
    subprocess.run([need_tool("espeak-ng"), "-w", str(voice), "These are the exact words of my voice, recorded once."],
                   check=True, timeout=60)
    return {"checkpoint": str(checkpoint), "artifacts": str(root / "artifacts"), "voice": str(voice)}


def _swapped(command: str, values: dict[str, str]) -> list[str]:
    for text, stand_in in SWAPS.items():
        if text in command:
            command = command.replace(text, stand_in.format(**values))
    return shlex.split(command)


@pytest.fixture(scope="module")
def served(made):
    """The README's `serve` line (SWAPS applied) on free ports: the worker every client command reaches."""
    argv = _swapped(SERVE, made) + ["--port", "0", "--artifact-port", "0", "--artifact-grace-s", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        ready = READY.match(proc.stdout.readline().strip())  # blocks until ready (or the worker exits)
        assert ready, proc.stderr.read()[-3000:] if proc.poll() is not None else "no ready line"
        promised = re.search(r"^# -> (breeze-worker ready: .*)$", _blocks("bash")[1], re.M)
        assert promised and READY.match(promised.group(1)), "the README's ready line is not the worker's"
        assert made["checkpoint"] in ready.group(3) and "NOT speech" in ready.group(3)
        from breeze_client.sdk import BreezeClient

        with BreezeClient(ready.group(1), timeout_s=120) as client:
            artifact = client.synthesize("An artifact to fetch by its id.", seed=3).artifact
        yield {**made, "target": ready.group(1), "artifact": artifact.artifact_id}
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.fixture(scope="module")
def served_http(made, tmp_path_factory):
    """The README's HTTP line (SWAPS applied: its HTTP face on any free port) run in a scratch directory, which
    holds its default `artifacts` directory; the base URL is read from its log line `HTTP face on URL/`."""
    here = tmp_path_factory.mktemp("http")
    argv = _swapped(SERVE_HTTP, made) + ["--port", "0", "--artifact-port", "0", "--artifact-grace-s", "0"]
    with open(here / "worker.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=here, stdout=subprocess.PIPE, stderr=log, text=True, env=ENV)
    try:
        ready = READY.match(proc.stdout.readline().strip())  # blocks until ready (or the worker exits)
        logged = (here / "worker.log").read_text()
        assert ready, logged[-3000:]
        found = HTTP_LINE.search(logged)  # logged before the ready line is printed
        assert found, logged[-3000:]
        yield f"http://127.0.0.1:{found.group(1)}"  # the README's address, on the port the worker took
    finally:
        proc.terminate()
        proc.wait(60)


def _flags(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


@pytest.mark.parametrize("command", [c for c in HOW if isinstance(HOW[c], Run)])
def test_the_readme_command_runs(command, served, tmp_path, request):
    how = HOW[command]
    assert isinstance(how, Run)
    http_base = request.getfixturevalue("served_http") if "http://127.0.0.1:7860" in command else ""
    argv = _swapped(command, {**served, "http_base": http_base})
    if argv[0] == "python":
        argv[0] = sys.executable
    elif argv[0] == "curl":
        argv[0] = need_tool("curl")
    env = {**ENV, "BREEZE_TARGET": served["target"], "QUICKSTART_DIR": str(tmp_path / "quickstart")}
    done = subprocess.run([*argv, *how.smaller], cwd=ROOT if how.at_root else tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    for text in how.says:
        assert text in output, f"{command}: {text!r} not in\n{output[-4000:]}"
    for name in how.writes:
        path = tmp_path / name
        assert path.is_file() and path.stat().st_size > 0, f"{command} wrote no {name}"
        if name.endswith(".wav"):
            audio, rate = sf.read(path, dtype="int16")
            assert rate == 24000 and len(audio) > 0
        elif name.endswith(".json") and name != "trace.json":
            json.loads(path.read_text())  # one JSON document (--json FILE)
        elif name.endswith(".pcm"):  # 16-bit samples, not an error's JSON body (curl exits 0 on any status)
            assert path.stat().st_size % 2 == 0 and not path.read_bytes().startswith(b"{")
    if argv[:2] == ["breeze-client", "diagnose"]:  # a run at a time, though stderr is no terminal
        assert [line for line in done.stderr.splitlines() if line.startswith("diagnose: run ")] == [
            line for line in done.stderr.splitlines() if re.match(r"diagnose: run [123] of 3: ", line)]
        assert "diagnose: run 3 of 3: " in done.stderr


@pytest.mark.parametrize("command", [c for c in HOW if isinstance(HOW[c], Flags)])
def test_the_readme_benchmark_command_uses_the_tools_flags(command):
    argv = shlex.split(command)
    assert argv[0] == "python" and argv[1].startswith("benchmarks/")
    done = subprocess.run([sys.executable, argv[1], "--help"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    missing = [flag for flag in _flags(argv) if flag not in done.stdout]
    assert missing == [], f"{command}: {missing} not in its --help"


def test_the_readme_sdk_example_runs(served, tmp_path):
    """The ```python block, as written, against the served worker (`player` is a sink for the PCM)."""
    (example,) = _blocks("python")
    code = example.replace('"gpu-host:50051"', repr(served["target"]))
    assert code != example
    prelude = "class _Sink:\n    def write(self, pcm):\n        pass\n\n\nplayer = _Sink()\n"
    done = subprocess.run([sys.executable, "-c", prelude + code], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    audio, rate = sf.read(tmp_path / "hello.wav", dtype="int16")
    assert rate == 24000 and len(audio) > 0
