"""The diagnosis report renders in headless Chromium: no errors, one bar per phase, the timeline visible;
the verdict coloured by severity; bars, axis and hatching valid when the clock mapping is not."""

import dataclasses
import os
import re
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

from host_tools import need_tool
from test_retrieval_phases import make_timeline

from breeze_client.phases import PHASES, fetch_ns, format_seconds
from breeze_client.report import COLORS, LABEL_W, PLOT_W, render_report, write_report
from breeze_client.report import SEVERITY_COLORS as VERDICT_COLORS
from breeze_client.verdict import diagnose

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    return need_tool("chromium", "chromium-browser")


def run_chromium(url: str, *extra: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="breeze-chromium-") as profile:
        return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, HOME=profile))


def read_png_rgb(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and interlace == 0 and color in (2, 6), header
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line[j] for k in range(0, stride, bpp) for j in range(k, k + 3)))
        prev = line
    return width, height, rows


def longest_run(rows: list[bytes], color: bytes) -> int:
    """The longest horizontal run of pixels of exactly `color` (RGB) in the image."""
    best = 0
    for row in rows:
        run = 0
        for i in range(0, len(row), 3):
            run = run + 1 if row[i:i + 3] == color else 0
            best = max(best, run)
    return best




def check_report_renders(html_path: Path, runs: int, tmp: Path, wide_phase: str | None,
                         verdict_color: str | None = None) -> None:
    """Shared with the integration tests: DOM check, then a screenshot whose pixels show the waterfall bars
    (every phase's colour, the dominant phase `wide_phase` as a bar far wider than a table swatch, and the
    verdict box's border in `verdict_color`)."""
    url = html_path.resolve().as_uri()
    dom = run_chromium(url, "--virtual-time-budget=2000", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    head = dom.stdout[:400]
    assert 'data-render="ok"' in head, head
    assert "data-errors" not in head, head
    assert f'data-bars="{",".join([str(len(PHASES))] * runs)}"' in head, head
    shot = tmp / "report.png"
    result = run_chromium(url, "--window-size=1100,1400", f"--screenshot={shot}")
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    width, height, rows = read_png_rgb(shot)
    assert (width, height) == (1100, 1400)
    pixels = set()
    for row in rows:
        pixels.update(row[i:i + 3] for i in range(0, len(row), 3))
    visible = [name for name, color in COLORS.items() if bytes.fromhex(color[1:]) in pixels]
    assert set(visible) == set(COLORS), f"bars not visible in the screenshot: {set(COLORS) - set(visible)}"
    if wide_phase is not None:
        assert longest_run(rows, bytes.fromhex(COLORS[wide_phase][1:])) >= 60, f"no {wide_phase} bar on screen"
    if verdict_color is not None:  # the 5 px border runs down the verdict box's whole height
        column = [row[i:i + 3] for row in rows for i in range(0, len(row), 3)]
        assert bytes.fromhex(verdict_color[1:]) in set(column), f"no verdict border in {verdict_color}"


def test_report_renders_in_headless_chromium(tmp_path):
    runs = [make_timeline(f"art-{i}", slow="transfer", extra_ms=300 + 20 * i) for i in range(3)]
    report = write_report(tmp_path / "report.html", diagnose(runs), runs, title="test report")
    text = report.read_text()
    offline = text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a namespace name, not a fetch
    assert "http://" not in offline and "https://" not in offline and "<link" not in offline
    assert text.count('class="phase-bar"') == 3 * len(PHASES)
    check_report_renders(report, 3, tmp_path, "transfer")


def _rects(html: str) -> list[dict]:
    return [dict(re.findall(r'([\w-]+)="([^"]*)"', m)) for m in re.findall(r"<rect class=\"phase-bar\"([^>]*)>", html)]


def test_a_healthy_verdict_is_green_and_a_fault_red(tmp_path):
    healthy = [make_timeline(f"art-{i}") for i in range(2)]
    d = diagnose(healthy)
    assert d.verdict.cause == "none" and d.verdict.severity == "ok"
    report = write_report(tmp_path / "healthy.html", d, healthy)
    assert "data-severity='ok'" in report.read_text()
    shot = tmp_path / "healthy.png"
    assert run_chromium(report.resolve().as_uri(), "--window-size=1100,700", f"--screenshot={shot}").returncode == 0
    _, _, rows = read_png_rgb(shot)
    pixels = {row[i:i + 3] for row in rows for i in range(0, len(row), 3)}
    assert bytes.fromhex(VERDICT_COLORS["ok"][1:]) in pixels
    assert bytes.fromhex(VERDICT_COLORS["fault"][1:]) not in pixels
    slow = [make_timeline(f"art-{i}", slow="transfer", extra_ms=400) for i in range(2)]
    assert "data-severity='fault'" in render_report(diagnose(slow), slow)


def test_bars_and_axis_stay_valid_when_the_clock_mapping_is_broken():
    t = make_timeline("art-0", slow="client_write", extra_ms=20)
    worker_events = ("generation_done", "artifact_committed", "request_received", "first_byte_sent")
    shifted = {k: v - 2_000_000_000 if k in worker_events else v for k, v in t.events.items()}  # mis-mapped by 2 s
    why = "clock mapping broken: no exchange agrees with the order of events"
    broken = dataclasses.replace(t, events=shifted, clock={"status": "broken", "evidence": ["stepped -2.00 s"]},
                                 unmeasured={**{p: why for p in ("notify", "total", "waited", "request",
                                                                  "first_byte_transit")},
                                             **{f"event:{e}": why for e in worker_events}})
    html = render_report(diagnose([broken]), [broken])
    rects = {r["data-phase"]: r for r in _rects(html)}
    assert {rects[p]["data-state"] for p in ("notify", "request", "first_byte_transit")} == {"unmeasured"}
    assert rects["commit"]["data-state"] == "unplaced" and rects["server_first_byte"]["data-state"] == "unplaced"
    assert rects["transfer"]["data-state"] == "measured"
    for r in rects.values():  # every bar inside the plot, none negative
        x, w = float(r["x"]), float(r["width"])
        assert LABEL_W <= x and w > 0 and x + w <= LABEL_W + PLOT_W + 0.1, r
    ticks = re.findall(r'<text class="muted" x="[\d.]+" y="\d+" text-anchor="\w+">([^<]+)</text>', html)
    assert ticks[0] == "0" and all(not tick.startswith("-") for tick in ticks)
    # the axis spans the client's events (a few ms), not the 2 s the mis-mapped worker times would add
    assert ticks[-1].endswith("ms") and float(ticks[-1].split()[0]) < 100, ticks
    assert "data-severity='unknown'" in html and "stepped -2.00 s" in html


def test_uncertain_phases_are_hatched_in_the_waterfall_and_marked_in_the_table():
    runs = [make_timeline(f"art-{i}", uncertainty_ms=0.45) for i in range(2)]  # request and first byte < ±0.45 ms
    html = render_report(diagnose(runs), runs)
    for i in range(2):
        assert f'<pattern id="hatch-{i}"' in html  # one pattern per run's SVG, no duplicate ids
    hatched = {(r["data-phase"], r["fill"]) for r in _rects(html) if r["data-uncertain"] == "true"}
    assert {p for p, _ in hatched} == {"request", "first_byte_transit"}
    assert all(fill.startswith("url(#hatch-") for _, fill in hatched)
    table = html[html.index("<table class='phases'>"):]
    for title in ("request transit", "first byte transit"):
        row = table[:table.index(title)].rsplit("<tr", 1)[1]
        assert "class='uncertain'" in row and "&lt;±450 us" in table[table.index(title):].split("</tr>")[0]


PHONE, DESKTOP = (390, 844), (1280, 900)
FITS = bytes.fromhex("00c853")  # the page's layout mark (opened with #check-layout): it fits the window's width


def _screenshot(html_path: Path, tmp: Path, size: tuple[int, int]) -> list[bytes]:
    """A screenshot of the page at a window of `size`, as rows of RGB bytes (the layout mark painted)."""
    width, height = size
    shot = tmp / f"{html_path.stem}-{width}.png"
    result = run_chromium(html_path.resolve().as_uri() + "#check-layout", f"--window-size={width},{height}",
                          f"--screenshot={shot}", "--hide-scrollbars")
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    w, h, rows = read_png_rgb(shot)
    assert (w, h) == size
    return rows


def _pixel(rows: list[bytes], x: int, y: int) -> bytes:
    return rows[y][3 * x:3 * x + 3]


def _first_row_with(rows: list[bytes], color: bytes) -> int | None:
    return next((y for y, row in enumerate(rows) if any(row[i:i + 3] == color for i in range(0, len(row), 3))), None)


def _box(html: str) -> str:
    start = html.index("<div class='verdict")
    return html[start:html.index("</div>", start)]


def _stepped_runs() -> list:
    """A 3 min 05 s commit that the worker spent waiting for a CPU, in runs whose clocks moved (many lines)."""
    runs = []
    for i in range(3):
        t = make_timeline(f"art-{i:032x}", slow="commit", extra_ms=185_000)
        moves = [f"the worker's clock moved -2.00 s (exchange {k})" for k in range(4)]
        clock = {"status": "stepped", "evidence": moves,
                 "client_evidence": ["this client's wall clock moved +5.00 s against its monotonic clock"]}
        runs.append(dataclasses.replace(t, clock=clock, evidence={
            **t.evidence, "commit_storage_ns": 2_000_000_000, "commit_fsync_ns": 1_950_000_000, "commit_bytes": 46_000,
            "worker_commit_cpu_wait_ns": 180_000_000_000, "worker_commit_storage_cpu_wait_ns": 1_900_000_000}))
    return runs


def test_a_healthy_page_leads_with_healthy_on_a_phone_and_a_desktop(tmp_path):
    runs = [make_timeline(f"art-{i}") for i in range(3)]
    d = diagnose(runs)
    report = write_report(tmp_path / "healthy.html", d, runs, meta={"target": "127.0.0.1:50051"})
    html = report.read_text()
    body = html[html.index("<body>"):]
    assert body.index("<div class='verdict ok'") < body.index("<h2>")  # the verdict comes first, under the title
    box = _box(html)
    assert "Healthy</b>" in box and "Dominant" not in html and "starved" not in html
    assert not any(word in " ".join(d.verdict.evidence + d.verdict.details) for word in ("starved", "would have"))
    for size in (PHONE, DESKTOP):
        rows = _screenshot(report, tmp_path, size)
        assert _pixel(rows, size[0] - 6, 6) == FITS, f"the page is wider than a {size[0]} px window"
        top = _first_row_with(rows, bytes.fromhex(VERDICT_COLORS["ok"][1:]))
        assert top is not None and top < 120, top  # the green box opens the page
        assert _first_row_with(rows, bytes.fromhex(VERDICT_COLORS["fault"][1:])) is None


def test_a_fault_page_keeps_a_few_lines_in_the_box_and_the_rest_below_on_a_phone_and_a_desktop(tmp_path):
    runs = _stepped_runs()
    d = diagnose(runs)
    assert d.verdict.cause == "worker_cpu" and len(d.verdict.details) >= 12  # the clock lines, per run
    report = write_report(tmp_path / "fault.html", d, runs)
    html = report.read_text()
    box = _box(html)
    assert 2 <= box.count("<li>") <= 4 and "Worker starved of CPU</b>" in box
    shown = html[:html.index("<script type='application/json'")]  # what the page shows (not its JSON data)
    assert "3 min 05.0 s" in box and "185.0" not in shown and "185.00 s" not in shown  # minutes and seconds
    below = html[html.index("More evidence"):html.index("<h2>Phases")]
    assert below.count("<li>") == len(d.verdict.details)
    for size in (PHONE, DESKTOP):
        rows = _screenshot(report, tmp_path, size)
        assert _pixel(rows, size[0] - 6, 6) == FITS, f"the page is wider than a {size[0]} px window"
        top = _first_row_with(rows, bytes.fromhex(VERDICT_COLORS["fault"][1:]))
        assert top is not None and top < 120, top


def test_a_page_for_existing_artifacts_has_the_request_to_disk_row(tmp_path):
    runs = [make_timeline(f"r{i}", slow="transfer", extra_ms=300) for i in range(2)]
    existing = [dataclasses.replace(t, events={k: v for k, v in t.events.items()
                                               if k not in ("generation_done", "final_received")}) for t in runs]
    html = render_report(diagnose(existing), existing)
    table = html[html.index("<table class='phases'>"):]
    assert "data-row='fetch'" in table and "request → on disk" in table and "data-row='total'" not in table
    row = table[table.index("data-row='fetch'"):].split("</tr>")[0]
    assert f"<th>{format_seconds(fetch_ns(existing[0]) / 1e9)}</th>" in row, row  # 310.8 ms, request -> on disk
