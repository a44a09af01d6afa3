"""The documents against what they describe: the measurement data behind docs/performance.md, and the
defaults the documents quote against the settings' own (worker/breeze_worker/config.py).

docs/perf-data/ holds only the data the documents cite: each file named `<what>-<commit>-<yyyymmdd>.json`
(optionally `-pN`, one process of several) after its `meta.commit` and `meta.date`; every file cited exists
and every file is cited; a tree measured with uncommitted changes says what differed; no path of the
measuring host; the folder within its size bound. The defaults: each phrase of the table below is found in its
document and quotes the setting's default; every flag the decision log names is a setting, and the value or
the on/off it gives is the default.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from breeze_worker.config import WorkerSettings, setting_fields

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DATA = DOCS / "perf-data"
PERFORMANCE = DOCS / "performance.md"
MAX_DATA_BYTES = 300_000
NAME = re.compile(r"^(?P<what>[a-z0-9]+(?:-[a-z0-9]+)*?)-(?P<commit>[0-9a-f]{7})-(?P<date>\d{8})(?:-p\d+)?\.json$")
# a data file as the documents and the code cite it: its name, or a run of processes `...-p1..p4.json`
CITED = re.compile(r"[a-z0-9-]+-[0-9a-f]{7}-\d{8}(?:-p\d+(?:\.\.p\d+)?)?\.json")
# paths of the machine a measurement ran on (its scratch, home and install folders); repository-relative
# paths and placeholders (DIR, $OUT, BASE) are what the files hold instead
MACHINE_PATH = re.compile(r"(?<![\w.$~-])/(?:tmp|root|home|work|opt|mnt|srv|var|data|Users)/")
SESSION_LABEL = re.compile(r"\bM\d{1,2}\b|\bruns? \d+\b|\brun\d+\b|next device call|\bissue \d+")


def _data_files() -> list[Path]:
    return sorted(DATA.glob("*.json"))


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


SOURCE_DIRS = ("docs", "worker", "client", "benchmarks", "scripts", "tests", "ops", "protos")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".proto", ".yaml", ".yml", ".toml", ".txt", ".service", ".cfg"}


def _tracked_text() -> dict[str, str]:
    """The repository's text files (the README and every source and document folder) but the data files
    themselves and this file (whose docstrings show the patterns), by repository path."""
    here = Path(__file__).resolve()
    paths = [ROOT / "README.md"]
    for folder in SOURCE_DIRS:
        paths += [p for p in (ROOT / folder).rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()]
    out = {}
    for path in paths:
        if path == here or DATA in path.parents:
            continue
        out[str(path.relative_to(ROOT))] = path.read_text(errors="replace")
    return out


def _expand(citation: str) -> list[str]:
    """`x-p1..p4.json` -> x-p1.json ... x-p4.json; any other citation is one name."""
    m = re.fullmatch(r"(.*-p)(\d+)\.\.p(\d+)\.json", citation)
    if not m:
        return [citation]
    return [f"{m[1]}{i}.json" for i in range(int(m[2]), int(m[3]) + 1)]


def _citations() -> dict[str, set[str]]:
    """Data file name -> the tracked files citing it: any name of the data files' form anywhere in the tree, any
    `perf-data/NAME.json`, and every backquoted `NAME.json` of docs/performance.md (all of which are data)."""
    cited: dict[str, set[str]] = {}
    for where, text in _tracked_text().items():
        found = set(CITED.findall(text)) | set(re.findall(r"perf-data/([\w.-]+\.json)", text))
        if where == "docs/performance.md":
            found |= set(re.findall(r"`([\w.-]+\.json)`", text))
        for citation in found:
            for name in _expand(citation):
                cited.setdefault(name, set()).add(where)
    return cited


def test_each_data_file_is_named_after_its_commit_and_date():
    files = _data_files()
    assert files
    for path in files:
        m = NAME.match(path.name)
        assert m, f"{path.name}: name it <what>-<commit, 7 hex>-<yyyymmdd>.json after its meta"
        meta = json.loads(path.read_text()).get("meta")
        assert isinstance(meta, dict), f"{path.name} has no meta"
        assert str(meta.get("commit", "")).startswith(m["commit"]), (path.name, meta.get("commit"))
        assert str(meta.get("date", "")).replace("-", "")[:8] == m["date"], (path.name, meta.get("date"))


def test_a_measurement_of_uncommitted_changes_says_what_differed():
    for path in _data_files():
        meta = json.loads(path.read_text())["meta"]
        if meta.get("tree_dirty", meta.get("dirty")):
            assert "tree_dirty" in meta and str(meta.get("tree_note", "")).strip(), \
                f"{path.name}: measured with uncommitted changes: say so in meta.tree_dirty and meta.tree_note"


def test_every_cited_data_file_exists():
    missing = {name: sorted(where) for name, where in _citations().items() if not (DATA / name).is_file()}
    assert not missing, f"cited but not in docs/perf-data: {missing}"


def test_every_data_file_is_cited_by_a_document():
    cited = _citations()
    documents = {str(p.relative_to(ROOT)) for p in _documents()}
    uncited = [p.name for p in _data_files() if not cited.get(p.name, set()) & documents]
    assert not uncited, f"no document cites {uncited}: cite them or remove them"


def test_the_data_holds_no_paths_of_the_measuring_host():
    for path in _data_files():
        text = path.read_text()
        hit = MACHINE_PATH.search(text)
        assert hit is None, f"{path.name}: {text[max(0, hit.start() - 40):hit.start() + 60]!r}"


def test_the_data_stays_within_its_size_bound():
    total = sum(p.stat().st_size for p in DATA.iterdir())
    assert total <= MAX_DATA_BYTES, f"docs/perf-data holds {total} bytes: keep summaries, not per-request dumps"


def test_the_performance_page_and_its_data_speak_of_the_product_not_of_sessions():
    for path in [PERFORMANCE, *_data_files()]:
        hit = SESSION_LABEL.search(path.read_text())
        assert hit is None, f"{path.name}: {hit[0]!r}: name the data file or the measured fact instead"


# ---- defaults quoted by the documents ----

def _settings_by_flag() -> dict[str, object]:
    return {f.flag: f for f in setting_fields(WorkerSettings)}


def _default(flag: str):
    field = _settings_by_flag().get(flag)
    assert field is not None, f"{flag} is not a setting of breeze-worker serve"
    return field.default  # type: ignore[attr-defined]


MIB = 1024 * 1024
# (document, phrase with the quoted value as group 1, setting flag, quoted value -> setting value)
QUOTED_DEFAULTS = [
    ("docs/operations.md", r"`--join-gather-ms N` \((\d+) by default", "--join-gather-ms", float),
    ("docs/operations.md", r"`--join-gather-quiet-ms` \((\d+) ms\)", "--join-gather-quiet-ms", float),
    ("docs/operations.md", r"`--join-gather-burst-quiet-ms` \((\d+) ms\)", "--join-gather-burst-quiet-ms", float),
    ("docs/operations.md", r"`--artifact-commit-threads` \((\d+)\) threads", "--artifact-commit-threads", int),
    ("docs/operations.md", r"\(`--gc-freeze`, (on|off)\)", "--gc-freeze", lambda v: v == "on"),
    ("docs/operations.md", r"sets a ([\d.]+) ms thread switch interval \(`--switch-interval-ms`\)",
     "--switch-interval-ms", float),
    ("docs/operations.md", r"`--max-connection-age-s` \((\d+) s;", "--max-connection-age-s", float),
    ("docs/operations.md", r"`--artifact-min-free-bytes` \(default (\d+) MiB\)", "--artifact-min-free-bytes",
     lambda v: int(v) * MIB),
    ("docs/operations.md", r"`--artifact-min-keep-s` \((\d+) s\)", "--artifact-min-keep-s", float),
    ("docs/operations.md", r"`--max-stream-buffer-bytes` \((\d+) MiB:", "--max-stream-buffer-bytes",
     lambda v: int(v) * MIB),
    ("docs/fidelity.md", r"By default its convolutions run in (TF32) where", "--codec-tf32", lambda v: True),
    ("docs/fidelity.md", r"`--fastpath-tune` \((on|off) by default\)", "--fastpath-tune", lambda v: v == "on"),
    ("README.md", r"By default the codec\s+runs in FP32 \((TF32) convolutions where the device has them",
     "--codec-tf32", lambda v: True),
    ("README.md", r"ready: synthesis=127\.0\.0\.1:(\d+)", "--port", int),
    ("README.md", r"artifacts=127\.0\.0\.1:(\d+)", "--artifact-port", int),
    ("README.md", r"breeze-worker ready: synthesis=([\d.]+):", "--host", str),
]


@pytest.mark.parametrize(("document", "phrase", "flag", "value"), QUOTED_DEFAULTS,
                         ids=[f"{d}:{f}" for d, _, f, _ in QUOTED_DEFAULTS])
def test_a_default_quoted_by_a_document_is_the_settings_default(document, phrase, flag, value):
    text = " ".join((ROOT / document).read_text().split())  # phrases may wrap across lines
    m = re.search(phrase, text)
    assert m, f"{document} no longer says {phrase!r}: update this table with the document"
    assert value(m[1]) == _default(flag), (document, m[0], _default(flag))


def test_the_decision_log_states_each_settings_default():
    """Each row of the decision log that names a setting (`--flag` or `--flag VALUE`) gives its default: the
    value it quotes, or for a switch the row's decision (a decision saying "off" for off, otherwise on)."""
    text = PERFORMANCE.read_text()
    log = text[text.index("## Decision log"):]
    checked = 0
    for row in (line for line in log.splitlines() if line.startswith("| ") and not line.startswith("| what")):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        if len(cells) < 2 or set(cells[0]) <= {"-", "|"}:
            continue
        for flag, quoted in re.findall(r"`(--[a-z0-9-]+)(?: ([\w.]+))?`", cells[0] + " " + cells[1]):
            default = _default(flag)
            if quoted:
                assert type(default)(quoted) == default, (row, flag, default)
            elif isinstance(default, bool):
                assert default is not bool(re.search(r"\boff\b", cells[1])), (row, flag, default)
            else:
                continue
            checked += 1
    assert checked >= 10
