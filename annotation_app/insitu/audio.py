"""Decode a capture's microphone track into the 16 kHz mono float32 samples Whisper expects.

PyAV (FFmpeg) reads whatever the recorders write: WAV from the desktop recorder, WebM/Opus or Ogg from the browser's
MediaRecorder, FLAC, MP3. Anything unusable raises `AudioError` with a message fit to show the annotator.
"""

from __future__ import annotations

import io
import logging
import os
import wave
from pathlib import Path
from typing import BinaryIO

import av
import av.error
import numpy as np

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
DEFAULT_MAX_SECONDS = 4 * 3600.0
TRUNCATION_TOLERANCE_S = 0.5  # decoded audio this much shorter than the container declares is a truncated file

AudioSource = str | os.PathLike[str] | bytes | bytearray | memoryview


class AudioError(ValueError):
    """The audio cannot be used: empty, corrupt, without an audio stream, silent of samples, or too long."""


def load_audio(
    source: AudioSource, *, max_seconds: float = DEFAULT_MAX_SECONDS, warnings: list[str] | None = None
) -> np.ndarray:
    """Decode `source` (a path or the file's bytes) to float32 mono samples at 16 kHz, resampling as needed.

    A file that breaks off part way (a browser tab closed mid-recording, an upload cut short) keeps the audio decoded
    before the break, and says so in `warnings` (shown on the capture); one that yields no audio at all raises
    `AudioError`, as do files longer than `max_seconds`.
    """
    label = _label(source)
    limit = int(max_seconds * SAMPLE_RATE)
    with _open(source, label) as container:
        stream = _audio_stream(container, label)
        declared = _declared_duration(container, stream)
        if declared is not None and declared > max_seconds:
            raise AudioError(_too_long(label, declared, max_seconds))
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        chunks: list[np.ndarray] = []
        total = 0
        try:
            for frame in container.decode(stream):
                frame.pts = None  # the resampler recomputes timing; broken pts in MediaRecorder files upset it
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
                    total += chunks[-1].size
                if total > limit:
                    raise AudioError(_too_long(label, total / SAMPLE_RATE, max_seconds, at_least=True))
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
                total += chunks[-1].size
        except (av.error.FFmpegError, OSError) as exc:
            if total == 0:
                raise AudioError(f"Could not decode {label}: {exc}. Is it a supported audio file?") from exc
            seconds = total / SAMPLE_RATE
            log.warning("%s breaks off after %.1f s (%s); keeping the audio before the break", label, seconds, exc)
            _warn(warnings, f"{_capital(label)} breaks off after {_hms(seconds)} ({exc}); the rest is lost")
    if total == 0:
        raise AudioError(f"{_capital(label)} contains no audio samples (zero length).")
    if total > limit:
        raise AudioError(_too_long(label, total / SAMPLE_RATE, max_seconds))
    decoded = total / SAMPLE_RATE
    declared = max(filter(None, (declared, _wav_header_duration(source))), default=None)
    if declared is not None and declared - decoded > max(TRUNCATION_TOLERANCE_S, 0.02 * declared):
        message = (
            f"{_capital(label)} is cut short: its header says {_hms(declared)}, but only {_hms(decoded)} could be "
            "decoded (a truncated upload or recording?); thoughts after that point are missing"
        )
        log.warning(message)
        _warn(warnings, message)
    audio = np.concatenate(chunks).astype(np.float32, copy=False)
    return np.nan_to_num(audio, copy=False, nan=0.0, posinf=1.0, neginf=-1.0)


def _warn(warnings: list[str] | None, message: str) -> None:
    if warnings is not None and message not in warnings:
        warnings.append(message)


def duration_seconds(audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float:
    """Length of decoded samples in seconds."""
    return audio.shape[-1] / sample_rate


def with_duration(data: bytes) -> bytes:
    """A WebM recording as the browser's MediaRecorder writes it, with no duration (players show 0:00 or Infinity and
    cannot seek), remuxed into a WebM that declares its duration and has cues; the audio itself is copied, not
    re-encoded. Other formats, and files that cannot be remuxed, are returned as they are."""
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as src:
            if "matroska" not in src.format.name or not src.streams.audio or src.duration is not None:
                return data
            out = io.BytesIO()
            with av.open(out, "w", format="webm") as dst:
                stream = src.streams.audio[0]
                copy = dst.add_stream_from_template(stream)
                for packet in src.demux(stream):
                    if packet.dts is None:  # the flush packet at the end
                        continue
                    packet.stream = copy
                    dst.mux(packet)
            return out.getvalue()
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        log.warning("could not remux the browser's WebM audio (%s); keeping it as recorded", exc)
        return data


def probe_duration(source: AudioSource) -> float | None:
    """The duration the container declares, without decoding; None when it declares none (MediaRecorder WebM)."""
    label = _label(source)
    with _open(source, label) as container:
        return _declared_duration(container, _audio_stream(container, label))


def _label(source: AudioSource) -> str:
    return "the uploaded audio" if isinstance(source, bytes | bytearray | memoryview) else f"audio file {source}"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _open(source: AudioSource, label: str) -> av.container.InputContainer:
    """Open a container from bytes or a path, turning every failure into an `AudioError`."""
    file: str | BinaryIO
    if isinstance(source, bytes | bytearray | memoryview):
        if len(source) == 0:
            raise AudioError("The uploaded audio is empty (0 bytes).")
        file = io.BytesIO(bytes(source))
    else:
        path = Path(source)
        if not path.is_file():
            raise AudioError(f"Audio file {path} does not exist.")
        if path.stat().st_size == 0:
            raise AudioError(f"Audio file {path} is empty (0 bytes).")
        file = str(path)
    try:
        return av.open(file, mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, OSError, UnicodeDecodeError) as exc:
        raise AudioError(f"Could not read {label}: it is corrupt or not an audio/video file ({exc}).") from exc


def _audio_stream(container: av.container.InputContainer, label: str) -> av.audio.stream.AudioStream:
    if not container.streams.audio:
        kinds = ", ".join(sorted({s.type for s in container.streams})) or "no streams at all"
        raise AudioError(f"{_capital(label)} has no audio stream (it holds {kinds}).")
    return container.streams.audio[0]


def _declared_duration(container: av.container.InputContainer, stream: av.audio.stream.AudioStream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _wav_header_duration(source: AudioSource) -> float | None:
    """The length a WAV file's header declares (FFmpeg clamps its duration to the bytes present, so a truncated
    file would look whole); None for anything else or a header the `wave` module cannot read."""
    try:
        file: BinaryIO = (
            io.BytesIO(bytes(source)) if isinstance(source, bytes | bytearray | memoryview) else open(source, "rb")
        )
        with file, wave.open(file, "rb") as wav:
            return wav.getnframes() / wav.getframerate()
    except (wave.Error, EOFError, OSError, ZeroDivisionError):
        return None


def _too_long(label: str, seconds: float, max_seconds: float, *, at_least: bool = False) -> str:
    length = f"{'over ' if at_least else ''}{_hms(seconds)}"
    return f"{_capital(label)} is {length} long; the limit is {_hms(max_seconds)}. Split it and upload the parts."


def _hms(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d} h" if hours else f"{rest // 60}:{rest % 60:02d} min"
