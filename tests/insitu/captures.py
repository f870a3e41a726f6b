"""Build real capture archives for tests and benchmarks: scripted input events, PNG frames, and speech made with
espeak-ng placed at known times in the audio track."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import jiwer
import numpy as np
import soundfile
from PIL import Image, ImageDraw
from whisper.normalizers import EnglishTextNormalizer

from annotation_app.insitu.audio import SAMPLE_RATE, load_audio

SCREEN = (640, 400)

# The scripted session's sentences, one per step. Each is long enough (10+ words) that tiny.en recognises it within
# the WER bound on any CPU: its int8 kernels differ between CPUs, and a 3-word phrase may come out as other words.
SCRIPT = (
    "I will open the file menu first to find the rename command",
    "now I type the new report title into the name field at the top",
    "that looks done to me so the task is finished and I can stop",
)
SCRIPT_WER = 0.35  # the bound on each step's thought against its sentence (10-14 words: up to 3-4 words wrong)

normalize = EnglishTextNormalizer()  # Whisper's own: case, punctuation, British/American spelling ("greyed")


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate as bench/asr.py measures it: jiwer after Whisper's English normaliser."""
    return jiwer.wer(normalize(reference), normalize(hypothesis))


@dataclass(frozen=True)
class Phrase:
    """Speech placed on the audio track: from `start` for `duration` seconds (capture clock)."""

    start: float
    text: str
    samples: np.ndarray = field(repr=False)

    @property
    def end(self) -> float:
        return self.start + len(self.samples) / SAMPLE_RATE


def speech(text: str, tmp: Path) -> np.ndarray:
    """`text` spoken by espeak-ng, as 16 kHz mono samples."""
    path = tmp / f"speech-{uuid.uuid4().hex}.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "140", "-w", str(path), text], check=True)
    return load_audio(path)


@dataclass
class CaptureBuilder:
    """Events on a running clock, frames, and phrases placed on the audio track at given capture times."""

    tmp: Path
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    events: list[dict] = field(default_factory=list)
    frames: dict[str, bytes] = field(default_factory=dict)
    phrases: list[Phrase] = field(default_factory=list)
    instruction: str = "Rename the report"
    task_id: int | None = None

    def event(self, t: float, kind: str, **fields) -> None:
        self.events.append({"t": t, "wall": 1_795_000_000 + t, "type": kind, **fields})

    def frame(self, t: float, label: str) -> None:
        name = f"frames/{len(self.frames):06d}.png"
        image = Image.new("RGB", SCREEN, (30 + 40 * len(self.frames) % 200, 90, 160))
        ImageDraw.Draw(image).text((20, 20 + 30 * len(self.frames) % 300), label, fill=(255, 255, 255))
        out = io.BytesIO()
        image.save(out, "PNG")
        self.frames[name] = out.getvalue()
        self.event(t, "screenshot", file=name, reason="pre_action")

    def click(self, t: float, x: int, y: int) -> None:
        self.frame(t - 0.05, f"before click at {x},{y}")
        self.event(t, "down", x=x, y=y, button="left")
        self.event(t + 0.08, "up", x=x, y=y, button="left")

    def type(self, t: float, text: str) -> None:
        self.frame(t - 0.05, f"before typing {text}")
        for i, ch in enumerate(text):
            self.event(t + 0.1 * i, "key_down", key=ch)
            self.event(t + 0.1 * i + 0.05, "key_up", key=ch)

    def say(self, t: float, text: str) -> Phrase:
        """Speak `text` from capture time `t` (synthesised now, so its end is known)."""
        phrase = Phrase(t, text, speech(text, self.tmp))
        self.phrases.append(phrase)
        return phrase

    def audio(self, length: float) -> np.ndarray:
        track = np.zeros(int(length * SAMPLE_RATE), dtype=np.float32)
        for phrase in self.phrases:
            start = int(phrase.start * SAMPLE_RATE)
            track[start : start + len(phrase.samples)] = phrase.samples[: len(track) - start]
        return track

    def archive(
        self, *, audio: bytes | None = None, audio_name: str = "audio.wav", session: dict | None = None
    ) -> bytes:
        """The tar the recorder would upload; `audio` overrides the spoken track (bad-input tests)."""
        end = max(e["t"] for e in self.events) + 1.0 if self.events else 1.0
        if audio is None and self.phrases:
            out = io.BytesIO()
            soundfile.write(out, self.audio(max(end, max(p.end for p in self.phrases) + 2)), SAMPLE_RATE, format="WAV")
            audio = out.getvalue()
        meta = {
            "format": 1,
            "session_id": self.session_id,
            "task_id": self.task_id,
            "instruction": self.instruction,
            "screen": {"width": SCREEN[0], "height": SCREEN[1], "scale": 1.0},
            "platform": "linux",
            "started_wall": 1_795_000_000.0,
            "audio": {"file": audio_name, "offset": 0.0} if audio is not None else None,
            "recorder": "tests",
        }
        meta.update(session or {})
        files = {
            "session.json": json.dumps(meta).encode(),
            "events.jsonl": "".join(json.dumps(e) + "\n" for e in sorted(self.events, key=lambda e: e["t"])).encode(),
            **self.frames,
        }
        if audio is not None:
            files[audio_name] = audio
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return out.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload(client, data: bytes, session_id: str, *, chunk: int = 64 * 1024, **start) -> dict:
    """Send `data` through the upload protocol with the DRF test client; the final state."""
    body = {"session_id": session_id, "size": len(data), "sha256": sha256(data), **start}
    state = client.post("/api/insitu/uploads/", body, format="json")
    assert state.status_code in (200, 201), state.content
    state = state.json()
    offset = state["offset"]
    while offset < len(data):
        part = data[offset : offset + chunk]
        response = client.put(
            f"/api/insitu/uploads/{state['id']}/",
            data=part,
            content_type="application/octet-stream",
            headers={
                "Content-Range": f"bytes {offset}-{offset + len(part) - 1}/{len(data)}",
                "X-Chunk-Sha256": sha256(part),
            },
        )
        assert response.status_code == 200, response.content
        state = response.json()
        offset = state["offset"]
    return state


def scripted(tmp_path) -> CaptureBuilder:
    """Say a sentence, click; say a sentence, type; say a closing sentence (SCRIPT). Each action comes 1.5 s after
    the sentence before it ends, so every word belongs to one step by time."""
    b = CaptureBuilder(tmp_path)
    b.frame(0.0, "start")
    said = b.say(0.5, SCRIPT[0])
    b.click(said.end + 1.5, 100, 200)
    said = b.say(said.end + 2.5, SCRIPT[1])
    b.type(said.end + 1.5, "Report")
    said = b.say(said.end + 3.0, SCRIPT[2])
    b.event(said.end + 2.0, "move", x=5, y=5)
    return b
