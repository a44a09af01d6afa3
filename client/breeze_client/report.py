"""A self-contained HTML report of retrieval diagnostics: the verdict, the phase table, a waterfall per run.

The page needs no network: CSS, SVG and a few lines of JavaScript are inline. It opens with the verdict
box: "Healthy", "Clock mapping broken", or the cause and the phase it holds, coloured by severity (green,
amber, red), with at most a few lines of evidence and the fix; the rest of the evidence follows below the
box. Each run's waterfall has one bar per phase (`rect.phase-bar`, `data-phase=<name>`), placed from the
run's earliest measured instant; a phase within the clock mapping's uncertainty is drawn hatched and
labelled `<±U`, in the waterfall and the table alike. A phase the clock check could not measure is drawn as
an empty outline at the axis start, labelled with the reason; one whose length is known but whose place is
not (a worker-side phase of a group the clock check could not map) keeps its length, dashed, at the axis
start. The axis only spans the events of measured, placed phases, so a mis-mapped worker time never
stretches it. The phase table ends with generation done -> on disk, or request -> on disk where generation
done is unknown (existing artifacts), and committed -> requested. On a narrow screen (a phone) the text
wraps and the wide parts (table, waterfalls) scroll sideways inside their own boxes, never the page. The
script only checks the page (bars per run, errors, whether the page fits the window's width) and records
the result on `<html data-render=... data-bars=... data-layout=... data-fits=...>`; opened with `#check-layout`
it also paints the last as a corner mark (green: fits), for a screenshot to read.
"""

from __future__ import annotations

import html
import json
import string
from collections.abc import Sequence
from pathlib import Path

from breeze_client.phases import (
    PHASES,
    Timeline,
    delivery_rate,
    fetch_ns,
    format_phase_value,
    format_seconds,
    phase_times,
    summarize,
    transfer_rate,
    waited_ns,
)
from breeze_client.verdict import Diagnosis

CAUSE_TITLES = {  # the verdict box's heading for each fault (verdict.CATALOGUE keys)
    "storage_write": "Slow artifact volume (writes)", "storage_read": "Slow artifact volume (reads)",
    "worker_busy": "Worker stalled", "worker_cpu": "Worker starved of CPU", "polling": "Polling",
    "buffering_intermediary": "Buffering intermediary", "cold_start": "Cold start",
    "client_delay": "Application delay", "network_latency": "Network latency",
    "payload_encoding": "Inflated payload", "per_message_overhead": "Small chunks",
    "window_limited": "Flow-control window", "connection_drops": "Dropped connections",
    "bandwidth": "Bandwidth", "slow_client_disk": "Slow client disk", "client_cpu": "Client starved of CPU",
}
COLORS = {
    "commit": "#8e44ad", "notify": "#2980b9", "client_gap": "#f39c12", "request": "#16a085",
    "server_first_byte": "#c0392b", "first_byte_transit": "#27ae60", "transfer": "#2c3e50",
    "client_write": "#d35400",
}
SEVERITY_COLORS = {"ok": "#1e8449", "unknown": "#d68910", "fault": "#b03a2e"}  # the verdict box's border
ROW_H, LABEL_W, PLOT_W, PAD = 18, 170, 640, 8

_CSS = string.Template("""
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 8px} h2{font-size:16px;margin:24px 0 8px}
table{border-collapse:collapse} td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}
.verdict{border-left:5px solid;padding:8px 14px;max-width:900px}
.verdict.fault{border-left-color:$fault;background:#fbeeee} .verdict.ok{border-left-color:$ok;background:#eef8f0}
.verdict.unknown{border-left-color:$unknown;background:#fdf3e7}
.verdict ul{margin:4px 0} .muted{color:#777} .swatch{display:inline-block;width:10px;height:10px;margin-right:6px}
.run{margin:10px 0 18px} .run h3{font-size:14px;margin:0 0 4px;font-weight:600}
.verdict .lead{margin:0 0 4px} .verdict .heading{font-size:16px} .verdict p{margin:4px 0}
li,p,h3{overflow-wrap:anywhere} .scroll{overflow-x:auto;max-width:100%} td,th{white-space:nowrap}
svg text{font:11px system-ui,sans-serif}
@media (max-width:600px){body{margin:10px;font-size:13px} .verdict{padding:6px 10px} td,th{padding:3px 6px}
  .verdict ul,ul.details{padding-left:18px}}
""").substitute(SEVERITY_COLORS)

_JS = """
(function(){
  var errors=[];
  window.addEventListener('error',function(e){errors.push(String(e.message));
    document.documentElement.setAttribute('data-errors',errors.join(' | '));});
  window.addEventListener('load',function(){
    var runs=document.querySelectorAll('.run'), counts=[];
    for(var i=0;i<runs.length;i++){counts.push(runs[i].querySelectorAll('rect.phase-bar').length);}
    var root=document.documentElement;
    root.setAttribute('data-bars',counts.join(','));
    root.setAttribute('data-render',errors.length?'error':'ok');
    var box=document.querySelector('.verdict').getBoundingClientRect();
    var fits=root.scrollWidth<=window.innerWidth&&box.left>=0&&box.right<=window.innerWidth;
    root.setAttribute('data-layout',[window.innerWidth,root.scrollWidth,Math.round(box.top),
                                     Math.round(box.left),Math.round(box.right)].join(','));
    root.setAttribute('data-fits',fits?'yes':'no');
    if(location.hash==='#check-layout'){  // a corner mark a screenshot can read: green fits, magenta overflows
      var mark=document.createElement('div'); mark.id='layout-check';
      mark.style.cssText='position:fixed;top:0;right:0;width:12px;height:12px;background:'+(fits?'#00c853':'#ff00ff');
      document.body.appendChild(mark);}
    var bars=document.querySelectorAll('rect.phase-bar');
    for(var j=0;j<bars.length;j++){bars[j].addEventListener('mouseenter',function(ev){
      var t=ev.target.querySelector('title'); if(t){ev.target.setAttribute('data-hover',t.textContent);}});}
  });
})();
"""


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _placed(timeline: Timeline, pt) -> bool:
    return pt.known and timeline.placed(pt.phase.start) and timeline.placed(pt.phase.end)


def _axis_range(timeline: Timeline, times) -> tuple[int, int]:
    """The axis: from the earliest to the latest event of the measured, placed phases (0..1 ns if none)."""
    ends = [timeline.events[e] for pt in times if _placed(timeline, pt) for e in (pt.phase.start, pt.phase.end)]
    if not ends:
        return 0, 1
    return min(ends), max(max(ends), min(ends) + 1)


def _waterfall(timeline: Timeline, index: int) -> str:
    times = phase_times(timeline)
    t0, t_end = _axis_range(timeline, times)
    span = t_end - t0
    height = len(PHASES) * ROW_H + 2 * PAD + 16
    width = LABEL_W + PLOT_W + 230
    hatch = f"hatch-{index}"
    parts = [f'<svg class="waterfall" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="waterfall of run {index + 1}">',
             f'<defs><pattern id="{hatch}" width="4" height="4" patternUnits="userSpaceOnUse" '
             'patternTransform="rotate(45)"><rect width="2" height="4" fill="#999"/></pattern></defs>']
    for row, pt in enumerate(times):
        y = PAD + row * ROW_H
        parts.append(f'<text x="4" y="{y + 12}">{_esc(pt.phase.title)}</text>')
        parts.append(f'<line x1="{LABEL_W}" x2="{LABEL_W + PLOT_W}" y1="{y + ROW_H - 1}" y2="{y + ROW_H - 1}" '
                     'stroke="#eee"/>')
        start = timeline.events.get(pt.phase.start)
        state = "measured"
        x: float  # the bar's left edge
        if not pt.known:
            state = "unmeasured" if pt.why else "unknown"
            x, w, text = LABEL_W, 2.0 if state == "unknown" else 12.0, pt.why or "unknown"
        else:
            assert start is not None and pt.span_ns is not None  # a measured phase has both events and its span
            x = LABEL_W + PLOT_W * (start - t0) / span
            w = min(max(PLOT_W * max(pt.span_ns, 0) / span, 2.0), PLOT_W)
            if not _placed(timeline, pt):  # its length is known, its place on the client clock is not
                state, x = "unplaced", LABEL_W
            text = format_phase_value(pt.seconds, pt.uncertainty_ns / 1e9)
            if pt.uncertainty_ns and not pt.below_uncertainty:
                text += f" ±{format_seconds(pt.uncertainty_ns / 1e9)}"
            if pt.phase.name == "transfer" and (rate := transfer_rate(timeline)):
                text += f" · {rate / 1e6:.2f} MB/s"
            if pt.span_ns != pt.duration_ns:
                text += f" (span {format_seconds(pt.span_ns / 1e9)})"
            if state == "unplaced":
                text += " (placement unknown: clock mapping broken)"
        x = min(max(x, LABEL_W), LABEL_W + PLOT_W - w)
        color = COLORS[pt.phase.name]
        fill = "none" if state == "unmeasured" else f"url(#{hatch})" if pt.below_uncertainty else color
        dash = ' stroke-dasharray="3,2"' if state in ("unmeasured", "unplaced") else ""
        tip = f"{pt.phase.title}: {text} — {pt.phase.meaning}"
        parts.append(f'<rect class="phase-bar" data-phase="{pt.phase.name}" data-state="{state}" '
                     f'data-uncertain="{str(pt.below_uncertainty).lower()}" x="{x:.1f}" y="{y + 2}" '
                     f'width="{w:.1f}" height="{ROW_H - 5}" fill="{fill}" stroke="{color}"{dash}>'
                     f'<title>{_esc(tip)}</title></rect>')
        if pt.phase.name == "transfer" and pt.span_ns and pt.duration_ns is not None and pt.span_ns > pt.duration_ns:
            ow = w * (pt.span_ns - pt.duration_ns) / pt.span_ns  # client write time inside the transfer span
            inside = format_seconds((pt.span_ns - pt.duration_ns) / 1e9)
            parts.append(f'<rect class="write-overlap" x="{x + w - ow:.1f}" y="{y + 6}" width="{ow:.1f}" '
                         f'height="{ROW_H - 13}" fill="{COLORS["client_write"]}" opacity="0.8"><title>'
                         f'client write calls inside the transfer: {_esc(inside)}'
                         '</title></rect>')
        parts.append(f'<text x="{min(x + w + 4, LABEL_W + PLOT_W + 4):.1f}" y="{y + 12}">{_esc(text)}</text>')
    axis_y = PAD + len(PHASES) * ROW_H + 12
    for k in range(5):  # ticks at 0, 1/4 ... of the measured span
        tx = LABEL_W + PLOT_W * k / 4
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"
        parts.append(f'<line class="tick" x1="{tx:.1f}" x2="{tx:.1f}" y1="{axis_y - 10}" y2="{axis_y - 6}" '
                     f'stroke="#999"/><text class="muted" x="{tx:.1f}" y="{axis_y}" text-anchor="{anchor}">'
                     f'{_esc(format_seconds(span * k / 4 / 1e9) if k else "0")}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _phase_table(diagnosis: Diagnosis, timelines: Sequence[Timeline]) -> str:
    rows = ["<table class='phases'><tr><th>phase</th><th>where</th><th>p50</th><th>p95</th><th>max</th>"
            "<th>clock ±</th></tr>"]
    for phase in PHASES:
        s = diagnosis.summaries[phase.name]
        u = s.uncertainty_s
        cells = [format_phase_value(v, u) for v in (s.p50_s, s.p95_s, s.max_s)]
        uncertain = " class='uncertain'" if s.below_uncertainty else ""
        rows.append(f"<tr{uncertain}><td><span class='swatch' style='background:{COLORS[phase.name]}'></span>"
                    f"{_esc(phase.title)}</td><td>{phase.where}</td>"
                    + "".join(f"<td>{_esc(c)}</td>" for c in cells)
                    + f"<td>{_esc(format_seconds(u) if u else '0')}</td></tr>")
    total = diagnosis.summaries["total"]
    generated = total.count > 0 or any("generation_done" in t.events for t in timelines)
    spans = [("waited", "committed → requested", diagnosis.summaries["waited"])]
    if not total.count:  # generation done unknown (existing artifacts) or unmeasured: the fetch stands in
        fetch = summarize("fetch", [None if (ns := fetch_ns(t)) is None else ns / 1e9 for t in timelines])
        spans.insert(0, ("fetch", "request → on disk", fetch))
    if generated:
        spans.insert(0, ("total", "generation done → on disk", total))
    for key, title, t in spans:
        if not t.count and key == "waited":
            continue
        cells = [format_phase_value(v, t.uncertainty_s) for v in (t.p50_s, t.p95_s, t.max_s)]
        rows.append(f"<tr data-row='{key}'><th>{_esc(title)}</th><th></th>"
                    + "".join(f"<th>{_esc(c)}</th>" for c in cells)
                    + f"<th>{_esc(format_seconds(t.uncertainty_s) if t.uncertainty_s else '0')}</th></tr>")
    rows.append("</table><p class='muted'>A value shown as &lt;±U (hatched in the waterfall) is within the clock "
                "mapping's uncertainty U: too short to tell from zero. committed → requested is how long the file "
                "sat committed before it was asked for.</p>")
    return "".join(rows)


def _verdict(diagnosis: Diagnosis) -> str:
    """The verdict box (its heading, at most MAX_HEADLINE lines of evidence, the fix), then the rest below it."""
    v = diagnosis.verdict
    items = "".join(f"<li>{_esc(e)}</li>" for e in v.evidence)
    if v.needs_runs:
        items += f"<li>to tell apart: {_esc(v.needs_runs)}</li>"
    if v.severity == "ok":
        heading = "<b class='heading'>Healthy</b>: nothing in the retrieval path is measurably slow"
    elif v.severity == "unknown":
        heading = f"<b class='heading'>Clock mapping broken</b><br>{_esc(v.explanation)}"
    else:
        heading = (f"<b class='heading'>{_esc(CAUSE_TITLES.get(v.cause, v.cause))}</b> in the {_esc(v.title)} "
                   f"({v.share:.0%} of the p50 total)<br>{_esc(v.explanation)}")
    box = (f"<div class='verdict {v.severity}' data-severity='{v.severity}' data-cause='{_esc(v.cause)}'>"
           f"<p class='lead'>{heading}</p><ul>{items}</ul><p><b>Fix:</b> {_esc(v.fix)}</p></div>")
    if v.details:
        box += ("<h3>More evidence</h3><ul class='details'>"
                + "".join(f"<li>{_esc(e)}</li>" for e in v.details) + "</ul>")
    return box


def _run_header(t: Timeline, i: int) -> str:
    facts = [f"{t.file_bytes / 1e6:.2f} MB", f"chunk {t.chunk_size or 'default'}", t.compression,
             f"clock ±{format_seconds(t.clock_uncertainty_ns / 1e9)} ({t.clock_status})"]
    if (w := waited_ns(t)) is not None:
        facts.append(f"committed → requested {format_seconds(w / 1e9)}")
    if (r := delivery_rate(t)) is not None:
        facts.append(f"delivered {r / 1e6:.2f} MB/s")
    clock = "".join(f"<li>{_esc(e)}</li>" for e in t.clock_evidence)
    return (f"<h3>run {i + 1}: {_esc(t.label)} <span class='muted'>({_esc(', '.join(facts))})</span></h3>"
            + (f"<ul class='clock'>{clock}</ul>" if clock else ""))


def render_report(diagnosis: Diagnosis, timelines: Sequence[Timeline], *, title: str = "Retrieval diagnosis",
                  sweep: Sequence[dict] = (), meta: dict | None = None) -> str:
    """The whole page as one string (write it with `write_report`); `sweep` rows are SweepResult.to_dict()."""
    body = [f"<h1>{_esc(title)}</h1>", _verdict(diagnosis), "<h2>Phases</h2>",
            f"<div class='scroll'>{_phase_table(diagnosis, timelines)}</div>"]
    if sweep:
        body.append("<h2>Sweep</h2><div class='scroll'><table><tr><th>configuration</th><th>request → disk p50</th>"
                    "<th>transfer p50</th><th>MB/s</th><th>wire MB</th><th>dominant</th></tr>")
        for row in sweep:
            rate = row.get("mb_per_s_p50")
            body.append(f"<tr><td>{_esc(row['label'])}</td>"
                        f"<td>{_esc(format_seconds(row['request_to_disk']['p50_s']))}</td>"
                        f"<td>{_esc(format_seconds(row['transfer']['p50_s']))}</td>"
                        f"<td>{'-' if rate is None else f'{rate:.1f}'}</td><td>{row['wire_bytes'] / 1e6:.2f}</td>"
                        f"<td>{_esc(row.get('dominant', ''))}</td></tr>")
        body.append("</table></div>")
    body.append("<h2>Waterfall per run</h2>")
    for i, t in enumerate(timelines):
        body.append(f"<div class='run' data-run='{i}' data-clock='{_esc(t.clock_status)}'>{_run_header(t, i)}"
                    f"<div class='scroll'>{_waterfall(t, i)}</div></div>")
    if meta:
        body.append("<p class='muted'>" + " · ".join(f"{_esc(k)}: {_esc(v)}" for k, v in meta.items()) + "</p>")
    data = json.dumps({"diagnosis": diagnosis.to_dict(), "runs": [t.to_dict() for t in timelines]})
    data = data.replace("</", "<\\/")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>{''.join(body)}"
            f"<script type='application/json' id='diagnosis-data'>{data}</script>"
            f"<script>{_JS}</script></body></html>")


def write_report(path: str | Path, diagnosis: Diagnosis, timelines: Sequence[Timeline], **kwargs) -> Path:
    path = Path(path)
    path.write_text(render_report(diagnosis, timelines, **kwargs), encoding="utf-8")
    return path
