"""The doctor's outputs: the JSON document (schema `breeze-doctor/1`) and the text report, both built from the
facts, the probes' figures and the verdict. Pure functions of their inputs (the CPU tests build them from
recorded figures)."""

from __future__ import annotations

from dataclasses import asdict

from breeze_worker import jsonout
from breeze_worker.doctor import footprint
from breeze_worker.doctor.facts import DeviceFacts
from breeze_worker.doctor.figures import (
    FRAME_MS,
    GPU_CLASSES,
    H200_REFERENCE,
    RTF_TARGET,
    STOP_RATIO,
    BatchedPoint,
    Figures,
    ReferenceRun,
    class_of_device,
)
from breeze_worker.doctor.probes import PROBES
from breeze_worker.doctor.verdict import (
    HostContext,
    Verdict,
    class_row,
    floor_ms,
    policy_for,
    project_batched,
    project_class,
    verdict,
    x_realtime,
)

SCHEMA = "breeze-doctor/1"

PROBE_DESCRIPTIONS = {
    "copy_bandwidth": "device-to-device copy bandwidth (bytes read + written per second)",
    "floor": "the loaded model's weight bytes per frame and its byte floor at that bandwidth",
    "startup": "the worker's start-up split: load, FP16 overflow probe, compile, CUDA graph capture, warm-up",
    "memory": "model, one stream slot's caches, the engine's fixed rest, and how many streams fit",
    "fast_path": "batch-1 fast path, CFG on and off: ms per frame, codec ms, TTFA, ratio to the floor",
    "precision": "teacher-forced agreement with FP32 on a few frames (KL, top-1, top-k, non-finite logits)",
}


def policy_section(capability: tuple[int, int] | None, bf16_with_emulation: bool | None = None) -> dict:
    """What `auto` picks on this device and why, with engine/precision.py's table."""
    name = policy_for(capability)
    if capability is None:
        why = ("the CPU: auto serves fp32, the numerical reference (no fast half-precision GEMMs); on a GPU it "
               "would pick by compute capability, see the table")
    elif capability < (8, 0):
        said = "" if bf16_with_emulation is None else (
            f" torch.cuda.is_bf16_supported() says {bf16_with_emulation} here because it counts emulation.")
        why = (f"compute capability {capability[0]}.{capability[1]} has no BF16 tensor cores: BF16 would be emulated "
               "(GEMMs off the tensor cores, attention in the unfused math kernel, no BF16 kernels from "
               f"torch.compile below 8.0), several times slower.{said} auto serves fp16-mixed: FP16 weights and "
               "GEMMs; residual stream, norms, logits and softmax in FP32; any linear layer whose activations "
               "approach the FP16 limit on a short FP32 probe stays FP32; the codec stays FP32")
    else:
        why = (f"compute capability {capability[0]}.{capability[1]} has BF16 tensor cores: auto serves bf16, the "
               "checkpoint's own format; the codec stays FP32")
    return {"auto": name, "why": why, "table": [
        {"device": "CPU", "auto": "fp32"},
        {"device": "CUDA, compute capability < 8.0 (T4: 7.5)", "auto": "fp16-mixed"},
        {"device": "CUDA, compute capability >= 8.0", "auto": "bf16"}]}


def host_figures(facts: DeviceFacts, measured: dict, policy: str, config,
                 reference: ReferenceRun = H200_REFERENCE) -> Figures | None:
    """This host's figures from what the probes measured; the batched steps are projected from the reference
    with the device's class (none when the class is unknown). None without a measured batch-1 LM time."""
    fast = (measured.get("fast_path") or {}).get("cfg") or {}
    lm = fast.get("ms_per_frame")
    if not lm:
        return None
    floor_doc = measured.get("floor") or {}
    bytes_per_frame = (floor_doc.get("bytes_per_frame") or {}).get("total") or footprint.frame_bytes(config, policy)
    bandwidth = (measured.get("copy_bandwidth") or {}).get("bytes_per_s")
    codec = fast.get("codec_ms_per_frame")
    projected = {"batched"}
    cls = class_of_device(facts.name)
    floor = floor_ms(bytes_per_frame, bandwidth)
    batched: tuple[BatchedPoint, ...] = ()
    if cls is not None and floor:
        batched = project_batched(lm, codec if codec is not None else reference.batched[0].codec_ms, floor,
                                  footprint.params_per_frame(config), cls.half_tflops, cls.fp32_tflops, reference)
    memory = measured.get("memory") or {}
    nocfg = ((measured.get("fast_path") or {}).get("nocfg") or {}).get("ms_per_frame")
    return Figures(device=facts.name, source="measured on this host by `breeze-worker doctor` (batched steps "
                   f"projected from {reference.device} figures" + (f" and {cls.name} datasheet figures)" if cls
                                                                     else "; unknown GPU class: not projected)"),
                   policy=policy, bandwidth=bandwidth, bytes_per_frame=bytes_per_frame, lm_ms_cfg=lm,
                   lm_ms_nocfg=nocfg, codec_ms=codec, ttfa_ms=fast.get("ttfa_ms"),
                   memory_bytes=memory.get("total_bytes"), model_bytes=memory.get("model_bytes"),
                   fixed_bytes=memory.get("fixed_bytes"), stream_bytes=memory.get("stream_bytes"),
                   batched=batched, projected=frozenset(projected))


CAPACITY = 2048  # positions a stream slot holds in the projections (the released max sequence)
# the T4's 16-bit options, before and after: (label, backbone KV cache in FP16, codec convolutions in FP16)
T4_OPTIONS = (("FP32 KV caches, FP32 codec", False, False), ("FP16 backbone KV cache", True, False),
              ("FP16 codec convolutions", False, True), ("both", True, True))


def class_figures(config, reference: ReferenceRun = H200_REFERENCE, *, half_kv: bool = True,
                  half_codec: bool = False, classes=GPU_CLASSES) -> list[Figures]:
    """GPU classes projected from the reference (the model's footprint at `CAPACITY` positions per policy).
    Defaults as the worker serves: under fp16-mixed the backbone's KV cache in FP16 (`half_kv`, where the
    checkpoint's q/k norm gains allow it), the codec in FP32."""
    policies = ("bf16", "fp16-mixed")
    model_bytes = {p: footprint.weight_bytes(config, p) + footprint.codec_bytes(half_codec) for p in policies}
    stream_bytes = {p: footprint.stream_bytes(config, p, CAPACITY, half_kv) for p in policies}
    return [project_class(c, reference, params_per_frame=footprint.params_per_frame(config), model_bytes=model_bytes,
                          stream_bytes=stream_bytes, half_codec=half_codec) for c in classes]


def t4_options(config, reference: ReferenceRun = H200_REFERENCE) -> list[dict]:
    """A 16 GB T4 (fp16-mixed) projected before and after the 16-bit options (`T4_OPTIONS`): stream slots, the
    streams at RTF <= 0.5 and at RTF <= 1 and their aggregate, by the same projection as the class table."""
    t4 = next(c for c in GPU_CLASSES if c.name == "T4")
    rows = []
    for label, half_kv, half_codec in T4_OPTIONS:
        fig = class_figures(config, reference, half_kv=half_kv, half_codec=half_codec, classes=(t4,))[0]
        v = verdict(fig, HostContext(measured=False))
        best, within = v.best, v.within
        rows.append({"option": label, "half_kv": half_kv, "half_codec": half_codec, "slots": v.fits,
                     "stream_bytes": fig.stream_bytes, "model_bytes": fig.model_bytes,
                     "streams_rtf_0_5": 0 if within is None else within.streams,
                     "streams_rtf_1": 0 if best is None else best.streams,
                     "step_ms": None if best is None else best.step_ms,
                     "codec_ms": None if best is None else best.codec_ms,
                     "x_realtime": None if best is None else x_realtime(best.streams, best.step_ms)})
    return rows


def verdict_doc(fig: Figures | None, v: Verdict | None, subject: str) -> dict:
    if fig is None or v is None:
        return {"subject": subject, "lines": ["no verdict: the fast path was not measured and this device's class "
                                              "has no projection"], "next_steps": []}
    return {
        "subject": subject, "figures_source": fig.source, "policy": fig.policy,
        "batch1_ms": v.batch1_ms, "rtf_batch1": v.rtf_batch1, "floor_ms": v.floor_ms,
        "rtf_target": v.rtf_target,
        "streams_within_rtf_target": 0 if v.within is None else v.within.streams,
        "streams_fit": v.fits, "realtime_streams": None if v.best is None else v.best.streams,
        "stop": None if v.stop is None else {**asdict(v.stop), "stop": v.stop.stop, "overhead_ms": v.stop.overhead_ms},
        "stop_ratio": STOP_RATIO, "cost": v.cost,
        "batched": [{**asdict(p), "step_ms": p.step_ms, "rtf": p.step_ms / FRAME_MS} for p in fig.batched],
        "projected": sorted(fig.projected), "lines": v.lines, "next_steps": v.next_steps,
    }


def build(*, meta: dict, facts: DeviceFacts, policy: dict, config, measured: dict, missing: dict[str, str],
          subject_figures: Figures | None, context: HostContext, subject: str,
          prices: dict[str, float], host_price: float | None) -> dict:
    """The whole document. `subject_figures`: this host's (measured) figures, or the projected class the CPU
    report speaks for; `prices`: hourly prices by class name for the cost table."""
    v = None if subject_figures is None else verdict(subject_figures, context, host_price)
    classes = [class_row(f, prices.get(f.device)) for f in class_figures(config)]
    not_measured = [{"probe": name, "why": missing[name]} for name in PROBES if name in missing]
    return {
        "schema": SCHEMA, "meta": meta, "device": facts.to_dict(), "policy": policy,
        "model": {"bytes_per_frame": {p: footprint.frame_bytes(config, p) for p in ("bf16", "fp16-mixed")},
                  "weight_bytes": {p: footprint.weight_bytes(config, p) for p in ("fp32", "bf16", "fp16-mixed")},
                  "codec_bytes": footprint.codec_bytes(), "source": "computed from the configuration"},
        "measured": measured, "not_measured": not_measured,
        "would_measure": [{"probe": name, "what": PROBE_DESCRIPTIONS[name]} for name in PROBES],
        "verdict": verdict_doc(subject_figures, v, subject),
        "projections": {"reference": {"device": H200_REFERENCE.device, "source": H200_REFERENCE.source},
                        "model": "LM = byte floor at the datasheet bandwidth + the reference's overhead above its "
                                 "floor (+ its growth with streams); codec = the reference's, its growth scaled by "
                                 "FP32 throughput; streams half with CFG; memory slots at 2048 positions",
                        "rtf_target": RTF_TARGET, "classes": classes, "t4_options": t4_options(config)},
    }


def write_json(doc: dict, path: str) -> None:
    jsonout.write(doc, path)


# ---------------------------------------------------------------- text


def _f(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _gib(value) -> str:
    return _f(None if value is None else value / 2**30, ".2f")


def _device_lines(doc: dict) -> list[str]:
    d = doc["device"]
    v = d["versions"]
    lines = [f"device: {d['name']}"]
    if d["type"] == "cuda":
        cap = d["capability"]
        smi = d["smi"] or {}
        lines.append(f"  compute capability {cap[0]}.{cap[1]}, {d['multiprocessors']} SMs, memory "
                     f"{_gib(d['memory_free_bytes'])} GiB free of {_gib(d['memory_total_bytes'])} GiB")
        if smi:
            lines.append(f"  driver {smi.get('driver_version')}, clocks SM {_f(smi.get('clocks.sm'), '.0f')} / max "
                         f"{_f(smi.get('clocks.max.sm'), '.0f')} MHz, memory {_f(smi.get('clocks.mem'), '.0f')} / max "
                         f"{_f(smi.get('clocks.max.mem'), '.0f')} MHz, {smi.get('pstate')}, power "
                         f"{_f(smi.get('power.draw'), '.0f')} / {_f(smi.get('power.limit'), '.0f')} W")
        else:
            lines.append(f"  clocks, driver and power not read: {d['smi_error']}")
        if d["emulates_bf16"]:
            lines.append("  BF16 is emulated on this GPU (compute capability < 8.0)")
        lines.append("  busy: " + ("; ".join(d["busy_reasons"]) if d["busy"] else "no (no other process seen)"))
    lines.append(f"  python {v['python']}, torch {v['torch']} (CUDA {v['torch_cuda'] or 'none'}), triton "
                 f"{v['triton'] or 'not installed'}, transformers {v['transformers'] or 'not installed'}")
    return lines


def _measured_lines(doc: dict) -> list[str]:
    m = doc["measured"]
    lines = []
    if "copy_bandwidth" in m:
        lines.append(f"copy bandwidth: {m['copy_bandwidth']['bytes_per_s'] / 1e9:.0f} GB/s")
    if "floor" in m:
        f = m["floor"]
        lines.append(f"byte floor: {f['bytes_per_frame']['total'] / 1e9:.2f} GB per frame -> {_f(f['floor_ms'])} ms "
                     f"({f['source']})")
    if "load" in m:
        load = m["load"]
        kept = f", {len(load['kept_fp32'])} layers kept FP32" if load["kept_fp32"] else ""
        lines.append(f"model: {load['model']} in {load['policy']}{kept}, {_gib(load['model_bytes'])} GiB")
    if "startup" in m:
        s = m["startup"]
        lines.append(f"start-up: load {_f(s['load_s'], '.1f')} s, overflow probe {_f(s['overflow_probe_s'], '.1f')} s, "
                     f"compile {_f(s['compile_s'], '.1f')} s, capture {_f(s['capture_s'], '.1f')} s, warm-up "
                     f"{_f(s['warm_up_s'], '.1f')} s = {_f(s['total_s'], '.1f')} s (cold compiler caches)")
    if "memory" in m:
        mem = m["memory"]
        lines.append(f"memory: model {_gib(mem['model_bytes'])} GiB, one stream slot {_gib(mem['stream_bytes'])} GiB "
                     f"({mem['capacity']} positions), fixed {_gib(mem['fixed_bytes'])} GiB -> {mem['streams_fit']} "
                     f"slots fit with {mem['headroom_fraction']:.0%} of {_gib(mem['total_bytes'])} GiB left free")
    if "fast_path" in m:
        for key, label in (("cfg", "CFG on"), ("nocfg", "CFG off")):
            r = m["fast_path"][key]
            lines.append(f"fast path, batch 1, {label}: {_f(r['ms_per_frame'])} ms per frame "
                         f"({_f(r['floor_ratio'])}x the floor), codec {_f(r['codec_ms_per_frame'])} ms, TTFA "
                         f"{_f(r['ttfa_ms'], '.1f')} ms, first use {_f(r['first_use_s'], '.1f')} s"
                         + (f"; fallback: {r['compile_fallback_reason'] or r['fallback_reason']}"
                            if (r['compile_fallback_reason'] or r['fallback_reason']) else ""))
    if "precision" in m:
        p = m["precision"]
        lines.append(f"precision vs FP32 ({p['frames']} teacher-forced frames, CFG on):")
        for row in p["policies"]:
            s = row["summary"] or {}
            if not row["applied"]:
                lines.append(f"  {row['policy']:<11} not applied: {row['error']}")
                continue
            lines.append(f"  {row['policy']:<11} KL mean {_f(s.get('kl_mean'), '.2e')}, top-1 "
                         f"{_f(s.get('top1_agreement'), '.3f')}, top-k {_f(s.get('topk_overlap'), '.3f')}, "
                         f"non-finite {s.get('nonfinite')}" + (f" [{row['note']}]" if row["note"] else ""))
    return lines


def _class_lines(doc: dict) -> list[str]:
    rows = doc["projections"]["classes"]
    priced = any(r["price_per_hour"] is not None for r in rows)
    head = (f"{'class':<11}{'policy':<12}{'GB/s':>6}{'floor ms':>9}{'b1 ms':>7}{'b1 x':>6}{'<=0.5':>6}{'slots':>6}"
            f"{'RT streams':>11}{'x batched':>10}"
            + (f"{'$/h':>7}{'$/audio h b1':>13}{'batched':>9}" if priced else ""))
    lines = ["projected per GPU class (not measured here; `--price-per-hour CLASS=PRICE,...` adds the cost):", head]
    for r in rows:
        line = (f"{r['class']:<11}{r['policy']:<12}{r['bandwidth_gb_s']:>6.0f}{_f(r['floor_ms'], '.1f'):>9}"
                f"{_f(r['batch1_ms'], '.1f'):>7}{_f(r['x_realtime_batch1'], '.2f'):>6}{r['streams_rtf_target']:>6}"
                f"{_f(r['fits'], 'd'):>6}{_f(r['realtime_streams'], 'd'):>11}{_f(r['x_realtime_batched'], '.1f'):>10}")
        if priced:
            line += (f"{_f(r['price_per_hour'], '.3f'):>7}{_f(r['cost_per_audio_hour_batch1'], '.3f'):>13}"
                     f"{_f(r['cost_per_audio_hour_batched'], '.4f'):>9}")
        lines.append(line)
    lines.append("b1: batch 1, CFG on (LM + codec); <=0.5: streams that keep RTF <= 0.5; slots: stream slots memory "
                 "holds; RT streams / x batched: the most aggregate audio with every stream at RTF <= 1")
    return lines


def _options_lines(doc: dict) -> list[str]:
    rows = doc["projections"].get("t4_options") or []
    if not rows:
        return []
    lines = ["projected for a 16 GB T4 (fp16-mixed), before and after the 16-bit options (`--fastpath-half-kv`, "
             "`--codec-precision fp16-mixed`):",
             f"{'option':<28}{'slot GiB':>9}{'slots':>6}{'<=0.5':>6}{'<=1':>5}{'step ms':>9}{'codec ms':>9}"
             f"{'x real time':>12}"]
    for r in rows:
        lines.append(f"{r['option']:<28}{_gib(r['stream_bytes']):>9}{_f(r['slots'], 'd'):>6}{r['streams_rtf_0_5']:>6}"
                     f"{r['streams_rtf_1']:>5}{_f(r['step_ms'], '.1f'):>9}{_f(r['codec_ms'], '.1f'):>9}"
                     f"{_f(r['x_realtime'], '.1f'):>12}")
    lines.append("<=0.5 / <=1: the most streams (1, 2, 4, ... 32) that fit and keep every stream at that RTF; step ms, "
                 "codec ms and x real time at the <=1 level")
    return lines


def markdown_options(rows: list[dict]) -> str:
    """The T4 options table as Markdown (docs/t4-playbook.md holds this function's output for the default model)."""
    lines = ["| on a 16 GB T4 | stream slot GB | stream slots | streams at RTF <= 0.5 | streams at RTF <= 1 "
             "| step ms (LM + codec) | codec ms | x real time |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['option']} | {r['stream_bytes'] / 1e9:.2f} | {_f(r['slots'], 'd')} "
                     f"| {r['streams_rtf_0_5']} | {r['streams_rtf_1']} | {_f(r['step_ms'], '.1f')} "
                     f"| {_f(r['codec_ms'], '.1f')} "
                     f"| {_f(r['x_realtime'], '.1f')} |")
    return "\n".join(lines)


def markdown_classes(rows: list[dict]) -> str:
    """The cost table as Markdown (docs/t4-playbook.md holds this function's output for the default model)."""
    lines = ["| GPU class | policy | bandwidth GB/s | bytes per frame GB | byte floor ms | batch 1 ms (LM + codec) "
             "| batch 1 x real time | streams at RTF <= 0.5 | stream slots in memory | real-time streams "
             "| x real time batched |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['class']} | {r['policy']} | {r['bandwidth_gb_s']:.0f} | {r['bytes_per_frame'] / 1e9:.2f} "
                     f"| {_f(r['floor_ms'], '.1f')} | {_f(r['batch1_ms'], '.1f')} "
                     f"| {_f(r['x_realtime_batch1'], '.2f')} "
                     f"| {r['streams_rtf_target']} | {_f(r['fits'], 'd')} | {_f(r['realtime_streams'], 'd')} "
                     f"| {_f(r['x_realtime_batched'], '.1f')} |")
    return "\n".join(lines)


def text(doc: dict) -> str:
    lines = ["breeze-worker doctor"] + _device_lines(doc)
    p = doc["policy"]
    lines.append(f"precision: auto -> {p['auto']}: {p['why']}")
    model = doc["model"]
    lines.append(f"model {doc['meta']['model']}: {model['bytes_per_frame']['bf16'] / 1e9:.2f} GB of weights read per "
                 f"frame in bf16, {model['bytes_per_frame']['fp16-mixed'] / 1e9:.2f} GB in fp16-mixed; weights "
                 f"{model['weight_bytes']['bf16'] / 1e9:.2f} / {model['weight_bytes']['fp16-mixed'] / 1e9:.2f} / "
                 f"{model['weight_bytes']['fp32'] / 1e9:.2f} GB in bf16 / fp16-mixed / fp32 (from the configuration)")
    if not doc["measured"]:
        lines.append("on a CUDA GPU the doctor measures:")
        lines += [f"  {w['probe']}: {w['what']}" for w in doc["would_measure"]]
    measured = _measured_lines(doc)
    if measured:
        lines.append("measured:")
        lines += [f"  {line}" for line in measured]
    if doc["not_measured"]:
        lines.append("not measured:")
        lines += [f"  {n['probe']}: {n['why']}" for n in doc["not_measured"]]
    v = doc["verdict"]
    lines.append(f"verdict ({v['subject']}):")
    lines += [f"  {line}" for line in v["lines"]]
    if v["next_steps"]:
        lines.append("next:")
        lines += [f"  - {step}" for step in v["next_steps"]]
    lines += _class_lines(doc)
    lines += _options_lines(doc)
    return "\n".join(lines)
