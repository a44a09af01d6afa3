"""The diagnosis report renders in headless Chromium: no errors, one bar per phase, the timeline visible."""

import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

from test_retrieval_phases import make_timeline

from breeze_client.phases import PHASES
from breeze_client.report import COLORS, write_report
from breeze_client.verdict import diagnose

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "headless Chromium is needed for the report test: apt-get install -y chromium"
    return exe


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


def check_report_renders(html_path: Path, runs: int, tmp: Path, wide_phase: str) -> None:
    """Shared with the integration tests: DOM check, then a screenshot whose pixels show the waterfall bars
    (every phase's colour, and the dominant phase `wide_phase` as a bar far wider than a table swatch)."""
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
    assert longest_run(rows, bytes.fromhex(COLORS[wide_phase][1:])) >= 60, f"no {wide_phase} bar on screen"


def test_report_renders_in_headless_chromium(tmp_path):
    runs = [make_timeline(f"art-{i}", slow="transfer", extra_ms=300 + 20 * i) for i in range(3)]
    report = write_report(tmp_path / "report.html", diagnose(runs), runs, title="test report")
    text = report.read_text()
    offline = text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a namespace name, not a fetch
    assert "http://" not in offline and "https://" not in offline and "<link" not in offline
    assert text.count('class="phase-bar"') == 3 * len(PHASES)
    check_report_renders(report, 3, tmp_path, "transfer")
