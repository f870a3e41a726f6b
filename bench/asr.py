#!/usr/bin/env python3
"""Speech recognition of think-aloud audio: faster-whisper (CTranslate2 int8) vs openai-whisper (PyTorch fp32).

Both backends transcribe the same recording, about two minutes of espeak-ng speech in the style of a GUI think-aloud
("I need to open the file menu first") between pauses of 2-8 s, through the same pipeline (Silero VAD, speech packed
into 30 s windows, word timestamps, beam 5) with the same tiny.en weights (openai-whisper gets them converted from
the CTranslate2 model). Figures: real-time factor (processing seconds / audio seconds, best of --repeat runs after a
warm-up), the process's CPU seconds in that run (shows when other load on the machine stretched the wall clock), and
WER against the script, normalised with Whisper's English normaliser. Goal: >= 5x real time at WER <= 10%.
openai-whisper is the baseline of the speed ratio.
Usage: .venv/bin/python bench/asr.py [--repeat 3] [--voice en-us] [--rate 140]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import jiwer
import numpy as np
from whisper.normalizers import EnglishTextNormalizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from annotation_app.insitu.asr import (
    BACKENDS,
    OPENAI_WHISPER,
    FasterWhisper,
    OpenAIWhisper,
    VadSettings,
    speech_windows,
)
from annotation_app.insitu.audio import SAMPLE_RATE, load_audio

SCRIPT = [
    "I need to open the file menu first",
    "the save button is greyed out so I will try the keyboard shortcut",
    "okay control S did nothing either",
    "maybe the document has not changed since the last save",
    "let me type something in the first paragraph",
    "now the save button is enabled",
    "I will click it and choose the documents folder",
    "the file name field already says untitled so I will rename it to quarterly report",
    "there is a warning that the file already exists",
    "I will replace it because this is the newer version",
    "next I want to export it as a PDF from the same menu",
    "the export dialog opened in a new window behind the browser",
    "I am switching to it with alt tab",
    "done, the PDF is in the downloads folder",
]
GOAL_SPEED, GOAL_WER = 5.0, 0.10


# The pauses between sentences: a think-aloud session with long silences (the VAD removes most of the audio), and
# dense speech (sentences under a second apart, most of the audio voiced), where the VAD's padding and merging show.
PAUSES = {"sparse": (2.0, 8.0), "dense": (0.3, 1.0)}


@dataclass
class Recording:
    audio: np.ndarray
    reference: str
    spans: list[tuple[float, float]]  # each sentence's first and last audible sample, in seconds

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def build_recording(folder: Path, voice: str, rate: int, seed: int, pauses: tuple[float, float]) -> Recording:
    """The script spoken by espeak-ng, each sentence after a pause drawn from `pauses` (3 s before the first)."""
    rng = random.Random(seed)
    parts, spans, at = [np.zeros(3 * SAMPLE_RATE, dtype=np.float32)], [], 3 * SAMPLE_RATE
    for i, sentence in enumerate(SCRIPT):
        wav = folder / f"{i:02d}.wav"
        if not wav.exists():
            subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(wav), sentence], check=True)
        spoken = load_audio(wav)
        audible = np.flatnonzero(np.abs(spoken) > 1e-3)
        spans.append(((at + audible[0]) / SAMPLE_RATE, (at + audible[-1] + 1) / SAMPLE_RATE))
        pause = np.zeros(int(rng.uniform(*pauses) * SAMPLE_RATE), dtype=np.float32)
        parts += [spoken, pause]
        at += len(spoken) + len(pause)
    return Recording(np.concatenate(parts), ". ".join(SCRIPT), spans)


def boundary_errors(words: list, spans: list[tuple[float, float]]) -> tuple[list[float], int]:
    """How far each sentence's first word starts and last word ends from where the speech really does (seconds),
    each word given to the sentence nearest its middle; and how many words reach over 0.2 s into a pause."""

    def distance(t: float, span: tuple[float, float]) -> float:
        return max(span[0] - t, 0.0, t - span[1])

    by_sentence: dict[int, list] = {}
    for word in words:
        middle = (word.start + word.end) / 2
        by_sentence.setdefault(min(range(len(spans)), key=lambda i: distance(middle, spans[i])), []).append(word)
    errors = []
    for i, said in by_sentence.items():
        errors += [said[0].start - spans[i][0], said[-1].end - spans[i][1]]
    gaps = [(spans[i][1], spans[i + 1][0]) for i in range(len(spans) - 1)]
    stretched = sum(
        any(min(word.end, gap_end) - max(word.start, gap_start) > 0.2 for gap_start, gap_end in gaps) for word in words
    )
    return errors, stretched


def measure(transcriber: FasterWhisper | OpenAIWhisper, recording: Recording, repeat: int) -> dict:
    normalize = EnglishTextNormalizer()
    audio, reference = recording.audio, recording.reference
    transcriber.transcribe(audio[: 8 * SAMPLE_RATE])  # warm-up: numba's DTW compiles, ONNX Runtime allocates
    times, cpu_times, transcript = [], [], None
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        transcript = transcriber.transcribe(audio)
        times.append(time.perf_counter() - started)
        cpu_times.append(time.process_time() - cpu_started)
    seconds = len(audio) / SAMPLE_RATE
    best = min(times)
    errors, stretched = boundary_errors(transcript.words, recording.spans)
    return {
        "boundary_ms": np.percentile(np.abs(errors), [50, 90]) * 1000,
        "early_ms": -min(errors) * 1000,
        "stretched": stretched,
        "model": transcript.model,
        "audio_s": seconds,
        "processing_s": best,
        "all_s": times,
        "cpu_s": cpu_times[times.index(best)],
        "rtf": best / seconds,
        "speed": seconds / best,
        "wer": jiwer.wer(normalize(reference), normalize(transcript.text)),
        "text": transcript.text,
        "words": len(transcript.words),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per backend; the best counts")
    parser.add_argument("--voice", default="en-us", help="espeak-ng voice")
    parser.add_argument("--rate", type=int, default=140, help="espeak-ng words per minute")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seed", type=int, default=0, help="for the pauses between sentences")
    parser.add_argument("--show-text", action="store_true", help="print each backend's transcript")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        recordings = {
            case: build_recording(Path(tmp), args.voice, args.rate, args.seed, pauses)
            for case, pauses in PAUSES.items()
        }
        cache = Path(tmp) / "whisper-cache"
        loaded: dict[str, FasterWhisper | OpenAIWhisper] = {}
        load_s: dict[str, float] = {}
        for backend in BACKENDS:
            started = time.perf_counter()
            if backend == OPENAI_WHISPER:
                loaded[backend] = OpenAIWhisper(cache_dir=cache, threads=args.threads, beam_size=args.beam_size)
            else:
                loaded[backend] = FasterWhisper(threads=args.threads, beam_size=args.beam_size)
            load_s[backend] = time.perf_counter() - started
        results = {
            (case, backend): measure(t, recording, args.repeat)
            for case, recording in recordings.items()
            for backend, t in loaded.items()
        }

    print(f"Audio: {len(SCRIPT)} sentences by espeak-ng -v {args.voice} -s {args.rate}; VAD {VadSettings()}")
    for case, recording in recordings.items():
        voiced = sum(end - start for start, end in recording.spans)
        kept = sum(r["end"] - r["start"] for w in speech_windows(recording.audio) for r in w) / SAMPLE_RATE
        print(f"- {case}: {recording.seconds:.1f} s, pauses of {PAUSES[case][0]:g}-{PAUSES[case][1]:g} s, "
              f"{voiced / recording.seconds:.0%} voiced, {kept:.1f} s kept as speech by the VAD")  # fmt: skip
    print(f"Decoding: beam {args.beam_size}, word timestamps, language en; faster-whisper {version('faster-whisper')} "
          f"(ctranslate2 {version('ctranslate2')}, int8, {args.threads} threads); openai-whisper "
          f"{version('openai-whisper')} (torch {version('torch')}, fp32, {args.threads} threads)")  # fmt: skip
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average before the "
          f"run {os.getloadavg()[0]:.2f}; best of {args.repeat} runs after a warm-up")  # fmt: skip
    print("Word boundaries: |first word's start - sentence start| and |last word's end - sentence end| against the "
          "known speech spans (median, p90); 'early': the earliest start before its sentence; 'stretched': words "
          "reaching over 0.2 s into a pause\n")  # fmt: skip
    columns = (
        "speech | backend | load s | audio s | processing s | CPU s | RTF | x real time | vs baseline | WER | "
        "boundary ms p50 / p90 | early ms | stretched | goal | met"
    )
    print(f"| {columns} |\n|{'---|' * len(columns.split(' | '))}")
    for case in PAUSES:
        baseline = results[(case, OPENAI_WHISPER)]
        for backend in (OPENAI_WHISPER, *[b for b in BACKENDS if b != OPENAI_WHISPER]):
            r = results[(case, backend)]
            cells = [
                case,
                f"{backend} {r['model']}" + (" (baseline)" if backend == OPENAI_WHISPER else ""),
                f"{load_s[backend]:.1f}",
                f"{r['audio_s']:.1f}",
                f"{r['processing_s']:.2f}",
                f"{r['cpu_s']:.1f}",
                f"{r['rtf']:.3f}",
                f"{r['speed']:.1f}x",
                f"{r['speed'] / baseline['speed']:.2f}x",
                f"{r['wer']:.1%}",
                f"{r['boundary_ms'][0]:.0f} / {r['boundary_ms'][1]:.0f}",
                f"{r['early_ms']:.0f}",
                str(r["stretched"]),
                f">= {GOAL_SPEED:g}x real time at WER <= {GOAL_WER:.0%}",
                "yes" if r["speed"] >= GOAL_SPEED and r["wer"] <= GOAL_WER else "no",
            ]
            print(f"| {' | '.join(cells)} |")
    print("\nAll runs (s): " + "; ".join(
        f"{case} {b} {', '.join(f'{t:.2f}' for t in r['all_s'])}" for (case, b), r in results.items()
    ))  # fmt: skip
    if args.show_text:
        for (case, backend), r in results.items():
            print(f"\n{case} {backend}: {r['text']}")


if __name__ == "__main__":
    main()
