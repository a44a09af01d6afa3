"""The OpenAI body's `voice`: a name for reference audio the worker holds.

With --http-voices-dir DIR, every `NAME.wav` beside a `NAME.txt` (the exact words spoken in it) is a voice
called NAME; the directory is read at each lookup, so voices can be added while the worker runs. A voice
is sent to the engine as reference audio with its transcript, as a gRPC request would send it: the engine
keeps encoded references by content, so only a voice's first use decodes it.

`default`, and OpenAI's own voice names (alloy, echo, ...) unless the directory holds a voice of that name,
mean the model's own voice: no reference. Any other name is a 400 that lists the voices there are.
`voice` may also be an object `{"id": NAME}` (the newer SDKs' form).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from breeze_worker.engine.types import ReferenceInput
from breeze_worker.transport.http.errors import HttpError

OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer",
                           "verse", "marin", "cedar"})
DEFAULT_VOICE = "default"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Voice:
    name: str
    wav: Path
    transcript: Path


class Voices:
    def __init__(self, directory: Path | None, max_bytes: int) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.max_bytes = max_bytes

    def held(self) -> dict[str, Voice]:
        """The directory's voices by name (none without a directory)."""
        if self.directory is None:
            return {}
        found = {}
        for wav in self.directory.glob("*.wav"):
            text = wav.with_suffix(".txt")
            if _NAME.fullmatch(wav.stem) and text.is_file():
                found[wav.stem] = Voice(wav.stem, wav, text)
        return found

    def names(self) -> list[str]:
        return [DEFAULT_VOICE, *sorted(self.held())]

    def reference_for(self, voice: object) -> ReferenceInput | None:
        """The reference a `voice` value stands for (None: the model's own voice); 400 for an unknown one."""
        if isinstance(voice, dict):
            voice = voice.get("id")
        if voice is None:
            return None
        if not isinstance(voice, str):
            raise HttpError(400, f"voice must be a name (a string) or {{\"id\": name}}, not {voice!r}", param="voice")
        held = self.held()
        if voice in held:
            entry = held[voice]
            audio = entry.wav.read_bytes()
            if len(audio) > self.max_bytes:
                raise HttpError(400, f"voice {voice}'s audio is {len(audio):,} bytes, more than the worker's "
                                     f"--max-request-bytes ({self.max_bytes:,}): shorten {entry.wav.name}",
                                param="voice")
            transcript = entry.transcript.read_text(encoding="utf-8").strip()
            return ReferenceInput(audio=audio, transcript=transcript)
        if voice == DEFAULT_VOICE or voice in OPENAI_VOICES:
            return None
        where = f" in {self.directory}" if self.directory is not None else " (no --http-voices-dir is set)"
        raise HttpError(400, f"unknown voice {voice!r}: the voices{where} are {', '.join(self.names())}; add "
                             f"{voice}.wav with its transcript in {voice}.txt to the voices directory",
                        param="voice")
