"""Continuous batching: every active stream advances one frame in ONE batched frame step.

`BatchedStepper` owns one `FrameStep` (engine/fastpath/step.py) sized for `max_streams` stream slots and
`max_rows` = 2 x max_streams model rows (at least 3), i.e. one static KV cache. A stream takes the lowest
free slot and one row per branch of its prompt: one, two with CFG (cond + uncond), three with voice
direction's two guidance scales (instruction, clone, plain prompts), and keeps its own prompt, guidance
scales, seed, sampling settings, frame limit and cache rows. Rows are counted at admission: with three-row
streams the rows can run out before the slots do, and a stream joins only when its rows are free
(`rows_free`, `rows_for`; the scheduler keeps a request queued until then, engine/scheduler.py; a join
without them is refused with ResourceExhausted). Streams join and leave at frame boundaries:

- join: the prompt (laid out when the request was resolved, engine/prompt.py) is encoded and prefilled into
  the stream's rows of the static cache. On CUDA several joiners at one boundary share one text-encoder
  batch (replayed from graphs captured at start-up, engine/fastpath/prompt.py) and one prefill per
  contiguous run of rows, whose input is one gather from a table of every joiner's prompt pieces
  (`gather_prompts`), so a join's host work does not grow by a few dozen launches per joiner; on the CPU
  each is prefilled on its own, exactly as it would be alone;
- each step: ONE `sample_frame` over the covered prefix of slots and rows, ONE host read (codes,
  end-of-speech and non-finite flags of every stream) and ONE `backbone_step` for the next frame, queued
  on the device before that read (every stream of the step writes its slot; those that turn out to end
  with this frame then leave), so the device never waits for the host's bookkeeping in between;
- leave: the slot and rows are parked (`FrameStep.release`) and reused by the next joiner;
- a stream whose frame held non-finite values (an FP16 overflow under fp16-mixed) has that frame recomputed
  for its rows alone at a safe precision and goes on from the same sampling state (fastpath/recovery.py); the
  event is counted in its info, logged once per request with the layer that overflowed, and only a frame that
  is not finite at the safe precision either ends the request.

A step covers a prefix of slots and rows, the *batch shape* (streams, rows). On CUDA the shape is rounded
up to a bucket (`bucket_shapes`: few shapes, because with compilation on each costs a compile) and each
bucket replays its own CUDA graph (engine/batch_graphs.py), compiled when the fast path's settings say so
(`compile_wanted`); on the CPU the exact prefix runs eagerly. Sampling noise is keyed by (seed, frame,
codebook) per stream and rows never mix, so a stream's frames do not depend on its company: on the CPU in
FP32 they are identical alone and batched (tests/engine/test_batching.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.batch_graphs import ShapeGraphs, covered_streams
from breeze_worker.engine.fastpath.compiled import compile_wanted
from breeze_worker.engine.fastpath.prompt import MAX_TEXT_SEGMENTS, text_encoder_graphs
from breeze_worker.engine.fastpath.recovery import (
    SAFE_PRECISION,
    Recovered,
    RecoveryFailed,
    RowPrompt,
    StreamHistory,
    recover_frame,
)
from breeze_worker.engine.fastpath.static_cache import bucket_for
from breeze_worker.engine.fastpath.step import READOUT_EOS, READOUT_NONFINITE, FrameStep, stream_setup
from breeze_worker.engine.prompt import GatheredPrompt, gather_prompts
from breeze_worker.engine.sampling import RowSampling
from breeze_worker.engine.stepper import StepOutcome
from breeze_worker.engine.types import EndReason, ResolvedRequest
from breeze_worker.errors import NumericalError, ResourceExhausted
from breeze_worker.model.loaded import LoadedModel

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Stream:
    key: object
    params: ResolvedRequest
    slot: int
    rows: list[int]  # [cond], [cond, uncond] or, with two guidance scales, [instruction, clone, plain]
    limit: int = 0  # frames allowed (request limit, capped by the cache capacity)
    frames: int = 0
    info: dict = field(default_factory=lambda: {"text_encode_s": 0.0, "prefill_s": 0.0, "generate_s": 0.0,
                                                 "nonfinite_events": 0, "nonfinite_recovered": 0,
                                                 "nonfinite_layer": ""})
    history: StreamHistory = field(default_factory=StreamHistory)  # what a recovery needs (fastpath/recovery.py)


def stream_buckets(max_streams: int) -> list[int]:
    """1, 2, 4, ... below max_streams, then max_streams."""
    out, b = [], 1
    while b < max_streams:
        out.append(b)
        b *= 2
    return out + [max_streams]


def bucket_shapes(max_streams: int) -> list[tuple[int, int]]:
    """The (streams, rows) buckets a CUDA stepper compiles and captures: each stream bucket s with room for
    all of them using CFG (2s rows), plus (max, 1.5 x max) so that a full batch of which half use CFG does
    not pay for 2 x max rows. No s-row shapes: at these sizes a step costs about the same for s and 2s
    rows, while every distinct shape costs a compile (~5 units) and graphs at start-up. The widest bucket
    covers every row, so streams with two guidance scales (three rows) need no shape of their own, except
    one stream alone: (1, 3) beside (1, 2)."""
    shapes = [(s, 2 * s) for s in stream_buckets(max_streams)]
    if max_streams == 1:
        shapes.append((1, 3))
    if max_streams >= 4:
        shapes.append((max_streams, (3 * max_streams + 1) // 2))
    return shapes


def pick_shape(shapes, need_streams: int, need_rows: int) -> tuple[int, int] | None:
    """The bucket with the fewest rows (then streams) covering the prefix; None when none does."""
    fits = [(r, s) for s, r in shapes if s >= need_streams and r >= need_rows]
    if not fits:
        return None
    r, s = min(fits)
    return s, r


class BatchedStepper:
    def __init__(self, model: LoadedModel, max_streams: int, device: torch.device | str | None = None, *,
                 use_graphs: bool | None = None, batch_joins: bool | None = None, buckets: bool | None = None,
                 eos_masked: bool = False, shapes: list[tuple[int, int]] | None = None,
                 settings: FastPathSettings | None = None, progressive: bool = False):
        """`settings`: the fast path's (config.py FastPathSettings; None: the defaults): whether the bucket
        shapes compile (`compile_wanted`), their forms, the sampler and the kernels' launch settings. `shapes`:
        the buckets to build (default `bucket_shapes(max_streams)`; the bench passes the subset its workloads
        land in). `progressive`: build only what one stream needs now (the smallest shape, uncompiled, and the
        text encoder's shapes for one join of one stream); the rest is built while streams run
        (`build_next`), and the stepper admits only as many streams as the built shapes serve
        (`ready_streams`)."""
        settings = settings or FastPathSettings()
        self.model = model
        self.device = torch.device(device) if device is not None else model.device
        self.max_streams = max_streams
        # two rows a stream on average; at least three, so that one stream with two guidance scales fits
        self.max_rows = max(2 * max_streams, 3)
        self.capacity = model.generation_defaults.max_sequence
        self.eos_masked = eos_masked  # bench only: end of speech never sampled
        on_cuda = self.device.type == "cuda"
        self.batch_joins = on_cuda if batch_joins is None else batch_joins
        self.step_buffers = FrameStep(model.lm, rows=self.max_rows, streams=max_streams, capacity=self.capacity,
                                      device=self.device, settings=settings)
        self.bucketed = on_cuda if buckets is None else buckets  # tests: CUDA's bucketed shapes on the CPU
        if not self.bucketed:
            shapes = []
        elif shapes is None:
            shapes = bucket_shapes(max_streams)
        bad = [sh for sh in shapes if not (0 < sh[0] <= max_streams and 0 < sh[1] <= self.max_rows)]
        if bad:
            raise ValueError(f"batch shapes {bad} outside {max_streams} streams / {self.max_rows} rows")
        graphed = on_cuda if use_graphs is None else (use_graphs and on_cuda)
        starter = sorted(shapes, key=lambda s: (covered_streams(s), s[1]))[:1] if progressive else None
        self.graphs = ShapeGraphs(self.step_buffers, shapes, use_graphs=graphed,
                                  compile=compile_wanted(self.device, settings), starter=starter)
        # the joins' text encoder: in graphs on CUDA, every batch a join can bring captured now (progressive:
        # a join of one stream now, the others' before the shapes that admit them are published)
        self.text_encoder = text_encoder_graphs(model.lm, self.device)
        self.graphed = graphed
        if graphed:
            self.text_encoder.prepare(self._join_segments(1 if progressive else max_streams))
        self.fallback_steps: dict[str, int] = {}  # steps on a slower form than asked for, by kind
        self._fallbacks_logged: set[tuple] = set()
        self._streams: dict[object, _Stream] = {}
        self._slot_owner: list[_Stream | None] = [None] * max_streams
        self._row_owner: list[_Stream | None] = [None] * self.max_rows
        self._row_pos = [0] * self.max_rows  # host mirror of each row's cache write position
        self._left: dict[object, dict] = {}  # info of streams that left, until the caller reads it
        self._unbucketed: set[tuple[int, int]] = set()  # prefixes no bucket covered (logged once each)
        self.release_all()
        self.steps = 0
        self.host_reads = 0

    def _join_segments(self, streams: int) -> int:
        """Text segments one join of up to `streams` joiners can bring."""
        return MAX_TEXT_SEGMENTS * (streams if self.batch_joins else 1)

    @property
    def ready_streams(self) -> int:
        """Streams the built shapes serve, whatever their mix (each may use CFG): what may be admitted."""
        if not self.bucketed:
            return self.max_streams
        return min(self.max_streams, max((covered_streams(s) for s in self.graphs.ready_shapes), default=0))

    def build_next(self) -> tuple[int, int] | None:
        """Build the next pending shape (progressive start, from a background thread), the text encoder's shapes
        for the joins its streams can bring first; returns it, or None when nothing is left."""
        pending = self.graphs.pending()
        if not pending:
            return None
        shape, compiled = pending[0]
        if self.graphed:
            self.text_encoder.prepare(self._join_segments(covered_streams(shape)), background=True)
        self.graphs.build(shape, compiled)
        return shape

    def stats(self) -> dict:
        """What the stepper serves with and what building it cost (bench JSON, logs)."""
        g = self.graphs
        return {"max_streams": self.max_streams, "capacity": self.capacity, "shapes": [list(s) for s in g.shapes],
                "ready_shapes": [list(s) for s in g.ready_shapes], "ready_streams": self.ready_streams,
                "fallback_steps": dict(self.fallback_steps), "capture_recompiles": g.capture_recompiles,
                "graphs": g.graph_count, "compile_requested": g.compile_requested, "compiled": g.compiled,
                "forms": {f"{s}x{r}": v.form.name for (s, r), v in g.views.items()},
                "compile_s": g.compile_s, "capture_s": g.capture_s, "build_s": g.compile_s + g.capture_s,
                "text_encoder_graphs": len(self.text_encoder.graphs), "text_encoder_capture_s":
                    self.text_encoder.prepare_s,
                "compile_fallback": g.compile_fallback_reason, "graph_fallback": g.fallback_reason,
                "batch_joins": self.batch_joins, "steps": self.steps, "host_reads": self.host_reads}

    # ---- shapes ----
    def _shape(self) -> tuple[int, int]:
        need_s = 1 + max(st.slot for st in self._streams.values())
        need_r = 1 + max(r for st in self._streams.values() for r in st.rows)
        if not self.bucketed:
            return need_s, need_r
        shape = pick_shape(self.graphs.ready_shapes, need_s, need_r)
        if shape is None:  # only with a custom `shapes` list: run the exact prefix, uncompiled and eager
            shape = (need_s, need_r)
            if shape not in self._unbucketed:
                self._unbucketed.add(shape)
                log.warning("no batch bucket covers %d streams / %d rows; that step runs eagerly", *shape)
        return shape

    # ---- slots and rows ----
    def __len__(self) -> int:
        return len(self._streams)

    @property
    def free_slots(self) -> int:
        """Slots a join may take now: free ones among those the built shapes serve (`ready_streams`)."""
        return max(0, min(self._slot_owner.count(None), self.ready_streams - len(self._streams)))

    @property
    def rows_free(self) -> int:
        """Model rows no stream holds."""
        return self._row_owner.count(None)

    @property
    def ready_rows(self) -> int:
        """Model rows the built shapes cover: a join takes rows below this."""
        if not self.bucketed:
            return self.max_rows
        return min(self.max_rows, max((rows for _, rows in self.graphs.ready_shapes), default=0))

    @property
    def ready_rows_free(self) -> int:
        """Model rows below `ready_rows` that no stream holds."""
        return self._row_owner[: self.ready_rows].count(None)

    @staticmethod
    def rows_for(params: ResolvedRequest) -> int:
        """The rows a request takes: one per branch of its prompt (1, 2 with CFG, 3 with two guidance scales)."""
        return params.branches

    def release_all(self) -> None:
        """Park every slot and row (start-up, after graph capture)."""
        for slot in range(self.max_streams):
            self.step_buffers.release(slot, [])
        self.step_buffers.release(None, list(range(self.max_rows)))
        self._row_pos = [0] * self.max_rows

    def _allocate(self, key: object, params: ResolvedRequest) -> _Stream:
        slot = self._slot_owner.index(None)
        need = self.rows_for(params)
        limit = self.ready_rows  # rows within what the built shapes cover
        free = [i for i, owner in enumerate(self._row_owner[:limit]) if owner is None]
        if len(free) < need:  # join() admits only what fits
            raise ResourceExhausted(f"{need} model rows needed, {len(free)} free")
        # the lowest run of `need` free rows (one prefill for the stream), else the lowest free rows
        rows = next((list(range(i, i + need)) for i in free
                     if i + need <= limit and all(self._row_owner[j] is None for j in range(i, i + need))),
                    free[:need])
        stream = _Stream(key, params, slot, rows)
        self._slot_owner[slot] = stream
        for r in rows:
            self._row_owner[r] = stream
        self._streams[key] = stream
        return stream

    def leave(self, key: object) -> None:
        stream = self._streams.pop(key, None)
        if stream is None:
            return
        self._slot_owner[stream.slot] = None
        for r in stream.rows:
            self._row_owner[r] = None
            self._row_pos[r] = 0
        self.step_buffers.release(stream.slot, stream.rows)
        if stream.info["nonfinite_events"]:  # its rows' caches hold what the bad step computed
            self.step_buffers.scrub(stream.rows)
        self._left[key] = stream.info

    def stream_info(self, key: object) -> dict:
        """text_encode_s, prefill_s, generate_s, nonfinite_events (frames whose values went non-finite),
        nonfinite_recovered (of those, recomputed and emitted) and nonfinite_layer (where the first one
        overflowed, "" when unknown) of a stream (active or left)."""
        stream = self._streams.get(key)
        return dict(stream.info if stream is not None else self._left.get(key, {}))

    def forget(self, key: object) -> None:
        self._left.pop(key, None)

    # ---- join ----
    @torch.no_grad()
    def join(self, joiners: list[tuple[object, ResolvedRequest]]) -> dict[object, BaseException]:
        """Admit streams at a frame boundary: encode their prompts and prefill their rows. Returns the
        streams that could not join (they hold no slot); the others step from the next `step()` on."""
        errors: dict[object, BaseException] = {}
        slots_left, rows_left, fitting = self.free_slots, self.ready_rows_free, []
        for key, params in joiners:  # in order: a joiner whose slot or rows are not free is refused
            need = self.rows_for(params)
            if slots_left < 1:
                errors[key] = ResourceExhausted(
                    f"all {self.max_streams} stream slots are busy" if self.ready_streams >= self.max_streams
                    else f"all {self.ready_streams} stream slots ready so far (of {self.max_streams}) are busy")
            elif need > rows_left:
                rows = (f"the {self.max_rows} model rows" if self.ready_rows >= self.max_rows
                        else f"the {self.ready_rows} model rows ready so far (of {self.max_rows})")
                errors[key] = ResourceExhausted(
                    f"{rows_left} of {rows} are free and this request needs {need} (one per prompt branch: "
                    "guidance takes 2, two guidance scales 3); retry when streams have finished")
            else:
                slots_left, rows_left = slots_left - 1, rows_left - need
                fitting.append((key, params))
        joiners = fitting
        t0 = time.perf_counter()
        prompts = self._encode(joiners, errors)
        encode_s = time.perf_counter() - t0
        streams, setups = [], []
        for (key, params), prompt in zip(joiners, prompts):
            if prompt is None:
                continue
            stream = self._allocate(key, params)
            stream.info["text_encode_s"] = encode_s
            stream.limit = max(0, min(params.max_frames, self.capacity - 1 - prompt.length))
            # the settings stay on the host until set_streams writes every joiner's at once
            sampling = RowSampling.from_params([params.sampling], [params.seed], "cpu")
            setups.append(stream_setup(stream.slot, stream.rows, params, sampling, self.eos_masked))
            streams.append((stream, prompt))
        self.step_buffers.set_streams(setups)
        t1 = time.perf_counter()
        try:
            self._prefill(streams)
        except Exception as exc:  # noqa: BLE001 - the joiners fail; running streams are untouched
            for stream, _ in streams:
                errors[stream.key] = exc
                self.leave(stream.key)
                self._left.pop(stream.key, None)
        prefill_s = time.perf_counter() - t1
        for stream, _ in streams:
            stream.info["prefill_s"] = prefill_s
        return errors

    def _encode(self, joiners, errors) -> list[GatheredPrompt | None]:
        """Each joiner's prompt (None where it failed): batching joins, one text-encoder batch and one table
        of prompt pieces for all joiners; else each joiner's on its own (exactly the alone computation).
        The encoder runs in graphs on CUDA (fastpath/prompt.py)."""
        if self.batch_joins:
            gathered = gather_prompts(self.model, [params for _, params in joiners], self.text_encoder)
        else:
            gathered = [gather_prompts(self.model, [params], self.text_encoder)[0] for _, params in joiners]
        out: list[GatheredPrompt | None] = []
        for (key, _), prompt in zip(joiners, gathered):
            if isinstance(prompt, BaseException):
                errors[key] = prompt
                out.append(None)
            else:
                out.append(prompt)
        return out

    def _prefill(self, streams: list[tuple[_Stream, GatheredPrompt]]) -> None:
        """Prefill each contiguous run of joiner rows in one call (left-padded to the run's longest prompt,
        its input one gather from the joiners' table) when batching joins; otherwise each stream's rows on
        their own."""
        pieces = []  # (row, the prompt's padded length, stream, its table indices)
        for stream, prompt in streams:
            for i, row in enumerate(stream.rows):
                pieces.append((row, prompt.length, stream, prompt.rows[i], prompt.table))
        pieces.sort(key=lambda p: p[0])
        runs: list[list] = []
        for piece in pieces:
            last = runs[-1][-1] if runs else None
            joinable = (last is not None and last[0] + 1 == piece[0]
                        and (self.batch_joins or last[2] is piece[2]))
            if joinable:
                runs[-1].append(piece)
            else:
                runs.append([piece])
        for run in runs:
            if self.batch_joins and len({id(p[2]) for p in run}) > 1:
                run = self._fit_capacity(run)
            self._prefill_run(run)

    def _fit_capacity(self, run: list) -> list:
        """A stream whose frame limit would not fit after the run's padding is prefilled on its own."""
        longest = max(p[1] for p in run)
        solo = [p for p in run if longest + p[2].limit > self.capacity - 1]
        for stream in {id(p[2]): p[2] for p in solo}.values():
            self._prefill_run([p for p in run if p[2] is stream])
        return [p for p in run if p not in solo] or []

    def _prefill_run(self, run: list) -> None:
        if not run:
            return
        rows = [p[0] for p in run]
        if rows != list(range(rows[0], rows[0] + len(rows))):  # split after capacity fitting: one call each
            for piece in run:
                self._prefill_run([piece])
            return
        longest = max(p[1] for p in run)
        table = run[0][4]  # a run's rows come from one join's (or, unbatched, one stream's) table
        # indices, positions and padding built on the host, then one gather
        index = np.full((len(run), longest), table.shape[0] - 1, dtype=np.int64)  # the zero row
        positions = np.ones((len(run), longest), dtype=np.int64)
        allowed = np.zeros((len(run), longest), dtype=np.bool_)
        for i, piece in enumerate(run):
            own = piece[3]
            index[i, longest - len(own):] = own
            positions[i, longest - len(own):] = np.arange(len(own))
            allowed[i, longest - len(own):] = True
            piece[2].history.prompts[piece[0]] = RowPrompt(table, own, longest)  # until its first frame is out
        embeds = table.index_select(0, _to_device(index.reshape(-1), self.device)).view(
            len(run), longest, table.shape[-1])
        self.step_buffers.prefill(slice(rows[0], rows[-1] + 1), embeds, _to_device(positions, self.device),
                                  _to_device(allowed, self.device))
        for r in rows:
            self._row_pos[r] = longest

    # ---- step ----
    @torch.no_grad()
    def step(self, while_running=None) -> dict[object, StepOutcome]:
        """One frame for every joined stream: one sample_frame, one host read, one backbone step.
        `while_running()` runs once the step's device work is queued, before the host read (on the CPU,
        where nothing is queued, before the step; not at all when the step queues nothing)."""
        ahead = while_running if self.device.type == "cuda" else None
        if while_running is not None and ahead is None:
            while_running()
        if not self._streams:
            return {}
        started = time.perf_counter()
        outcomes: dict[object, StepOutcome] = {}
        for stream in list(self._streams.values()):  # nothing to generate (prompt filled the cache)
            if stream.frames >= stream.limit:
                outcomes[stream.key] = StepOutcome(end_reason=EndReason.FRAME_LIMIT)
                self.leave(stream.key)
        if not self._streams:
            return outcomes
        shape = self._shape()
        bucket = None
        if any(st.frames + 1 < st.limit for st in self._streams.values()):  # someone may go on
            # every row of the step writes one slot: the bucket must hold all of them, ending or not
            next_slot = max(self._row_pos[r] for st in self._streams.values() for r in st.rows)
            bucket = bucket_for(next_slot + 1, self.capacity)

        def then():
            if bucket is not None:
                self._backbone_step(shape, bucket)
            if ahead is not None:
                ahead()
        self._count_fallback(shape)
        readout = self.graphs.sample_frame(shape, then)
        self.host_reads += 1
        self.steps += 1
        # one host conversion of the flags for every stream; `readout` is the step's own host copy, so each
        # stream's frame is a row of it (per-stream tensor calls cost ~10 us each, hundreds a step at 64 streams)
        flags = readout[:, [READOUT_NONFINITE, READOUT_EOS, 0]].tolist()
        codes = readout[:, :READOUT_EOS]
        for stream in list(self._streams.values()):
            nonfinite, eos, code0 = flags[stream.slot]
            frame = codes[stream.slot]
            if nonfinite:
                recovered = self._recover(stream, queued=bucket is not None)
                if isinstance(recovered, BaseException):
                    outcomes[stream.key] = StepOutcome(error=recovered)
                    continue
                if recovered.frame is not None:
                    frame, code0 = recovered.frame, int(recovered.frame[0])
                eos = recovered.frame is None
            if eos:
                outcomes[stream.key] = StepOutcome(end_reason=EndReason.END_OF_SPEECH)
            else:
                stream.frames += 1
                stream.history.emitted(frame, code0)
                done = stream.frames >= stream.limit
                outcomes[stream.key] = StepOutcome(frame=frame, end_reason=EndReason.FRAME_LIMIT if done else None)
        elapsed = time.perf_counter() - started
        for stream in list(self._streams.values()):
            stream.info["generate_s"] += elapsed
            if outcomes[stream.key].end_reason is not None or outcomes[stream.key].error is not None:
                self.leave(stream.key)
        return outcomes

    def _recover(self, stream: _Stream, queued: bool) -> Recovered | BaseException:
        """The stream's frame recomputed at the safe precision (fastpath/recovery.py), or the error that ends
        it. `queued`: this step's backbone step ran (every row wrote the slot before its host mirror's
        position); the stream continues when it did and the frame is not its last."""
        info, frame = stream.info, stream.frames
        info["nonfinite_events"] += 1
        first = info["nonfinite_events"] == 1
        after = 1 if queued else 0  # the queued step already moved each row one slot on
        logits_slots = {r: self._row_pos[r] - 1 - after for r in stream.rows}
        next_slots = {r: self._row_pos[r] - 1 for r in stream.rows} if queued and frame + 1 < stream.limit else None
        job = getattr(stream.key, "job_id", stream.key)
        try:
            recovered = recover_frame(self.step_buffers, slot=stream.slot, rows=stream.rows, frame=frame,
                                      history=stream.history, logits_slots=logits_slots, next_slots=next_slots)
        except RecoveryFailed as exc:
            layer = exc.layer or ""
            info["nonfinite_layer"] = info["nonfinite_layer"] or layer
            log.error("job %s: frame %d held non-finite values and %s%s", job, frame, exc,
                      f" (first layer out of FP16's range: {layer})" if layer else "")
            return NumericalError(
                f"frame {frame} held non-finite values in this worker's precision and again when recomputed at "
                f"a safe precision ({SAFE_PRECISION})" + (f"; they leave FP16's range first in {layer}" if layer
                                                         else "") +
                ". The same request and seed reproduce it, so retrying it will not help: serve it from a worker "
                "run with --precision fp32, and check the checkpoint with `breeze-worker precision-check "
                "--model DIR --per-step`")
        except Exception as exc:  # noqa: BLE001 - this stream only; the other streams of the step go on
            log.exception("job %s: recovering frame %d failed", job, frame)
            return exc
        info["nonfinite_recovered"] += 1
        info["nonfinite_layer"] = info["nonfinite_layer"] or (recovered.layer or "")
        if first:  # once per request; breeze_nonfinite_events_total counts every frame
            log.warning("job %s: frame %d held non-finite values (first layer out of FP16's range: %s); recomputed "
                        "at %s, the stream goes on from the same sampling state", job, frame,
                        recovered.layer or "none found", SAFE_PRECISION)
        return recovered

    def _count_fallback(self, shape: tuple[int, int]) -> None:
        """Count (and log once per shape and kind) a step that runs slower than the settings ask: uncompiled
        while compiling was asked for (the starter shape before its compiled build), or eagerly where graphs
        were asked for."""
        built = self.graphs.built.get(shape)
        kinds = []
        if self.graphs.compile_requested and (built is None or not built.view.compiled):
            kinds.append("uncompiled")
        if self.graphed and (built is None or not built.graphed):
            kinds.append("eager")
        for kind in kinds:
            self.fallback_steps[kind] = self.fallback_steps.get(kind, 0) + 1
            if (shape, kind) not in self._fallbacks_logged:
                self._fallbacks_logged.add((shape, kind))
                log.info("batch shape %dx%d runs %s (slower than configured)%s", shape[0], shape[1], kind,
                         " until its compiled build is ready" if kind == "uncompiled"
                         and self.graphs.compile_pending(shape) else "")

    def _backbone_step(self, shape: tuple[int, int], bucket: int) -> None:
        rows = shape[1]
        # idle rows inside the prefix write too, at their own position: restart those that would write
        # outside the bucket's slots (an out-of-range cache write is a device-side error on CUDA)
        stale = [r for r in range(rows) if self._row_owner[r] is None and self._row_pos[r] >= bucket]
        if stale:
            self.step_buffers.release(None, stale)
            for r in stale:
                self._row_pos[r] = 0
        self.graphs.backbone_step(shape, bucket)
        for r in range(rows):  # every covered row wrote one slot
            self._row_pos[r] += 1


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on `device`; to CUDA from pinned memory, queued (the host does not wait for the copy)."""
    host = torch.from_numpy(array)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
