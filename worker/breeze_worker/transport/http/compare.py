"""The listening page's side-by-side: a served job rendered again by the FP32 reference copy, with the agreement
figures `breeze-worker precision-check` computes (measure/rendering.py does the work).

`POST /v1/compare {"job_id": ...}` takes a recent HTTP job (its resolved request: text, template, seed, CFG
scale, reference codes), renders it on the FP32 copy, forces the copy's frames through the serving model and
the copy (teacher-forced), and answers both sides: what each is (precision, path, device), the reference's
audio (base64 s16le) and timings, the serving job's figures, the agreement per frame and codebook, and how
the two waveforms differ (the serving side read back from the job's artifact).

The copy is loaded only with --http-reference-fp32 (it is the model again, in FP32), in the background once
the worker starts; until then the answer is 503, and without the setting 501 with what to set. Renderings
run one at a time on a thread of their own.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import logging
from typing import TYPE_CHECKING

from breeze_worker.artifacts.wav import header_size
from breeze_worker.config import WorkerSettings
from breeze_worker.engine.types import PcmEncoding
from breeze_worker.transport.http.errors import HttpError
from breeze_worker.transport.http.jobs import RecentJobs

if TYPE_CHECKING:
    from breeze_worker.measure.rendering import ReferenceRenderer

log = logging.getLogger(__name__)


class Comparison:
    def __init__(self, settings: WorkerSettings, engine, store, recent: RecentJobs) -> None:
        self.enabled = settings.http.reference_fp32
        self._settings = settings
        self._engine, self._store, self._recent = engine, store, recent
        self.renderer: ReferenceRenderer | None = None  # once loaded
        self.state = "off" if not self.enabled else "loading"
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="breeze-reference")
        self._loading: asyncio.Task | None = None

    def start(self) -> None:
        if self.enabled:
            self._loading = asyncio.create_task(self._load())

    async def _load(self) -> None:
        from breeze_worker.measure.rendering import ReferenceRenderer

        try:
            loop = asyncio.get_running_loop()
            self.renderer = await loop.run_in_executor(
                self._executor, ReferenceRenderer.load, self._settings.engine, self._settings.http.reference_device)
            self.state = "ready"
        except Exception as exc:  # noqa: BLE001 - the page says why; serving goes on without the comparison
            log.error("the FP32 reference copy could not be loaded; the page's comparison is off", exc_info=exc)
            self.state = f"failed: {type(exc).__name__}: {exc}"

    async def stop(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def describe(self) -> dict:
        if not self.enabled:
            note = ("off: this worker was started without --http-reference-fp32, so only the serving rendering "
                    "plays; start it with that setting to hear an FP32 reference rendering beside it")
        elif self.renderer is None:
            note = "loading the FP32 copy" if self.state == "loading" else self.state
        else:
            note = self.renderer.description
        return {"enabled": self.enabled, "state": self.state, "description": note}

    def _serving_pcm(self, artifact_id: str) -> bytes | None:
        """The served job's samples, read back from its artifact (None when it has none)."""
        try:
            data = self._store.wav_path(artifact_id).read_bytes()
        except (OSError, ValueError, LookupError):
            return None
        return data[header_size(PcmEncoding.S16LE):] if data[:4] == b"RIFF" else None

    async def compare(self, job_id: object) -> dict:
        from breeze_worker.measure.rendering import waveform_difference

        if not self.enabled:
            raise HttpError(501, self.describe()["description"])
        if self.renderer is None:
            if self.state != "loading":
                raise HttpError(500, f"the FP32 reference copy is not available ({self.state}); see the worker log")
            raise HttpError(503, "the FP32 reference copy is still loading: try again shortly")
        if not isinstance(job_id, str):
            raise HttpError(400, "job_id must be the id of a job this worker ran over HTTP (X-Job-Id)", param="job_id")
        record = self._recent.get(job_id)
        if record is None:
            raise HttpError(404, f"job {job_id} is not among this worker's recent HTTP jobs: synthesize it again",
                            param="job_id")
        if record.finished is None:
            raise HttpError(409, f"job {job_id} is {record.ended}: compare a job that has finished", param="job_id")
        loop = asyncio.get_running_loop()
        rendering = await loop.run_in_executor(self._executor, self.renderer.render, record.params)
        runtime = self._engine.runtime
        figures = await loop.run_in_executor(self._executor, self.renderer.agreement, runtime.model, record.params,
                                             rendering.codes)
        artifact = record.finished.artifact
        serving_pcm = None if artifact is None else await asyncio.to_thread(self._serving_pcm, artifact.artifact_id)
        stats = record.to_json().get("stats", {})
        return {
            "job_id": job_id,
            "serving": {"precision": runtime.precision, "decode_path": runtime.decode_path,
                        "device": str(runtime.device), "description": self._engine.model_description, "stats": stats,
                        "artifact_id": artifact.artifact_id if artifact is not None else None},
            "reference": {"precision": "fp32", "description": self.renderer.description,
                          "frames": int(rendering.codes.shape[0]), "end_reason": rendering.end_reason,
                          "audio_seconds": rendering.audio_seconds, "wall_seconds": rendering.wall_s,
                          "rtf": rendering.wall_s / rendering.audio_seconds if rendering.audio_seconds else None,
                          "sample_rate": rendering.sample_rate,
                          "pcm_base64": base64.b64encode(rendering.pcm).decode()},
            "agreement": {"method": "teacher-forced on the FP32 rendering's frames: the serving model's logits "
                                    "against the FP32 copy's (breeze-worker precision-check's figures)", **figures},
            "waveform": None if serving_pcm is None else waveform_difference(serving_pcm, rendering.pcm),
        }
