#!/usr/bin/env python3
"""A 10-minute in-situ think-aloud session end to end through the processing pipeline.

The synthetic annotator of insitu_common for 10 minutes (~130 actions, a 1280x800 JPEG before each), a 10-minute
48 kHz WAV with an espeak-ng think-aloud sentence every ~20 s (silence between), built with
tests.insitu.captures.CaptureBuilder; stored in-process with uploads.start_upload/write_chunk into the bench database,
then pipeline.process() in this process with the default ASR backend (model loaded beforehand, as a worker does
once). Stages are timed from the pipeline's own Progress stage changes (plus wrappers around
parse_lines/reduce_events/load_audio/speech_regions for the split); total and x real time (600 s / total).

Usage (PostgreSQL and Redis running): source scripts/env.sh && .venv/bin/python bench/insitu_pipeline.py
  [--minutes 10] [--audio-rate 48000] [--chunk-mib 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import io
import itertools
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jiwer
import numpy as np
import soundfile
from insitu_common import (
    MB,
    SCREEN,
    THOUGHTS,
    TITLES,
    WORDS,
    BenchError,
    SyntheticSession,
    bench_database,
    log,
    machine_line,
    patched,
    run,
    upload_in_process,
    warn,
)
from PIL import Image, ImageDraw
from whisper.normalizers import EnglishTextNormalizer

from annotation_app.insitu.audio import SAMPLE_RATE
from tests.insitu.captures import CaptureBuilder


def frame_jpeg(rng: random.Random, title: str, pointer: tuple[int, int], index: int) -> bytes:
    """A plausible desktop screenshot: a window with a title bar, toolbar, text rows and the pointer."""
    w = SCREEN[0]
    shade = 200 + TITLES.index(title) * 8
    image = Image.new("RGB", SCREEN, (shade, shade, 235))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, w, 32), fill=(40, 44, 52))
    draw.text((12, 10), f"{title}  [{index}]", fill=(235, 235, 235))
    for i in range(8):
        draw.rectangle((12 + 90 * i, 42, 92 + 90 * i, 70), fill=(225, 228, 232), outline=(150, 150, 160))
        draw.text((20 + 90 * i, 50), rng.choice(WORDS), fill=(20, 20, 20))
    for row in range(22):
        y = 90 + 30 * row
        draw.line((12, y + 24, w - 12, y + 24), fill=(210, 210, 215))
        draw.text((20, y + 6), " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))), fill=(30, 30, 30))
        if rng.random() < 0.2:
            draw.rectangle((w - 260, y + 2, w - 40, y + 20), fill=(90, 140, 220))
    x, y = pointer
    draw.polygon([(x, y), (x, y + 18), (x + 5, y + 13), (x + 12, y + 13)], fill=(0, 0, 0), outline=(255, 255, 255))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=80)  # what the recorder writes
    return out.getvalue()


def build_session_capture(args: argparse.Namespace, tmp: Path) -> tuple[bytes, CaptureBuilder, SyntheticSession, str]:
    seconds = args.minutes * 60.0
    session = SyntheticSession.of_seconds(args.seed + 1, seconds)
    rng = random.Random(args.seed + 2)
    builder = CaptureBuilder(tmp, instruction="Export the quarterly report as a PDF into the downloads folder")
    builder.events = session.events
    title, pointer = TITLES[0], (SCREEN[0] // 2, SCREEN[1] // 2)
    log(f"{len(session.events):,} events, {session.frames} frames at {SCREEN[0]}x{SCREEN[1]} (JPEG q80)")
    for e in session.events:
        if e["type"] == "window":
            title = e["title"]
        elif e["type"] == "move":
            pointer = (e["x"], e["y"])
        elif e["type"] == "screenshot":
            builder.frames[e["file"]] = frame_jpeg(rng, title, pointer, len(builder.frames))
    script = []
    t = 4.0 + rng.uniform(0, 4)
    while t < seconds - 8:
        sentence = THOUGHTS[len(script) % len(THOUGHTS)]
        builder.say(t, sentence)
        script.append(sentence)
        t += 20 + rng.uniform(-4, 4)
    log(f"{len(script)} sentences by espeak-ng, {args.audio_rate} Hz mono WAV of {seconds:.0f} s")
    track = builder.audio(seconds)
    if args.audio_rate != SAMPLE_RATE:  # the recorder writes the microphone's own rate (48 kHz usually)
        n = int(len(track) * args.audio_rate / SAMPLE_RATE)
        track = np.interp(np.arange(n) * SAMPLE_RATE / args.audio_rate, np.arange(len(track)), track).astype(np.float32)
    wav = io.BytesIO()
    soundfile.write(wav, track, args.audio_rate, format="WAV", subtype="PCM_16")
    screen = {"width": SCREEN[0], "height": SCREEN[1], "scale": 1.0}
    archive = builder.archive(audio=wav.getvalue(), session={"screen": screen, "recorder": "bench/insitu_pipeline.py"})
    return archive, builder, session, ". ".join(script)


def word_error_rate(reference: str, hypothesis: str) -> float:
    """WER as bench/asr.py and tests/insitu/test_asr.py measure it: jiwer after Whisper's English normaliser."""
    normalize = EnglishTextNormalizer()
    return jiwer.wer(normalize(reference), normalize(hypothesis))


def table_pipeline(args: argparse.Namespace, user: Any, media: Path) -> tuple[str, dict[str, Any]]:
    from annotation_app.insitu import asr, pipeline
    from annotation_app.models import Capture, Step

    with tempfile.TemporaryDirectory(prefix="bench-insitu-speech-") as tmp:
        archive, _builder, session, script = build_session_capture(args, Path(tmp))
    seconds = args.minutes * 60.0

    log("loading the ASR model (a worker does this once)")
    started = time.perf_counter()
    transcriber = asr.get_transcriber()
    transcriber.transcribe(np.zeros(2 * SAMPLE_RATE, dtype=np.float32))  # loads the VAD model too
    load_s = time.perf_counter() - started

    log(f"uploading the {len(archive) / MB:.1f} MB capture in-process (start_upload/write_chunk)")
    capture, upload_s = upload_in_process(user, archive, args.chunk_mib << 20)

    marks: list[tuple[str, float]] = []
    split: dict[str, float] = {}

    class TimedProgress(pipeline.Progress):
        def __call__(self, stage: str, fraction: float, *, force: bool = True) -> None:
            if not marks or marks[-1][0] != stage:
                marks.append((stage, time.perf_counter()))
            super().__call__(stage, fraction, force=force)

    def timed(key: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            def run(*a: Any, **kw: Any) -> Any:
                started = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    split[key] = split.get(key, 0.0) + time.perf_counter() - started

            return run

        return wrap

    def ends(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **kw: Any) -> Any:
            result = fn(*a, **kw)
            marks.append(("(end)", time.perf_counter()))
            return result

        return run

    log(f"pipeline.process({capture.pk})")
    with (
        patched(pipeline, "Progress", lambda _original: TimedProgress),
        patched(pipeline, "parse_lines", timed("parse")),
        patched(pipeline, "reduce_events", timed("reduce")),
        patched(pipeline, "load_audio", timed("decode")),
        patched(asr, "speech_regions", timed("vad")),
        patched(pipeline, "_process", ends),
    ):
        started = time.perf_counter()
        capture = pipeline.process(capture.pk)
        total = time.perf_counter() - started
    if capture.status != Capture.Status.READY:
        raise BenchError(f"the capture ended {capture.status}: {capture.error}")
    stage_s = {a: tb - ta for (a, ta), (_b, tb) in itertools.pairwise(marks)}

    steps = Step.objects.filter(trajectory=capture.trajectory)
    words = [w for s in capture.transcript.get("segments", []) for w in s.get("words", [])]
    heard = " ".join(s["text"] for s in capture.transcript.get("segments", []))
    info = {
        "events": len(session.events),
        "archive_mb": len(archive) / MB,
        "upload_s": upload_s,
        "frames": session.frames,
        "actions_expected": sum(session.expected.values()),
        "steps": steps.count(),
        "with_screenshot": steps.exclude(screenshot="").count(),
        "with_thought": steps.exclude(thought="").count(),
        "words": len(words),
        "wer": word_error_rate(script, heard),
        "sentences": script.count(". ") + 1,
        "warnings": capture.warnings,
        "flags": capture.flags,
        "model": getattr(transcriber, "model_name", "?"),
        "backend": getattr(transcriber, "backend", "?"),
    }
    stages = [
        ("unpack", stage_s.get("unpacking", 0.0), "tar -> files (frames, audio, events)"),
        ("events + reduce", stage_s.get("reading events", 0.0),
         f"parse_lines {split.get('parse', 0):.2f} s + reduce_events {split.get('reduce', 0):.3f} s"),
        ("decode audio", stage_s.get("decoding audio", 0.0),
         f"load_audio {split.get('decode', 0):.2f} s ({args.audio_rate} Hz WAV -> 16 kHz float32)"),
        ("transcribe", stage_s.get("transcribing", 0.0),
         f"Silero VAD over the whole track {split.get('vad', 0):.2f} s, Whisper on the speech windows "
         f"{stage_s.get('transcribing', 0.0) - split.get('vad', 0):.2f} s"),
        ("align", stage_s.get("aligning", 0.0), "words -> steps"),
        ("curate", stage_s.get("curating", 0.0), "dHash of every key frame, signature, duplicates"),
        ("save", stage_s.get("saving", 0.0), "trajectory, steps with their screenshots, recording"),
    ]  # fmt: skip
    other = total - sum(s for _, s, _ in stages)
    lines = ["| stage | seconds | share of total | what |", "|---|---|---|---|"]
    for name, s, what in stages:
        lines.append(f"| {name} | {s:.2f} | {s / total:.0%} | {what} |")
    lines.append(f"| (status updates around the stages) | {other:.2f} | {other / total:.0%} | |")
    lines.append(
        f"| **total** `pipeline.process` | **{total:.1f}** | 100% | **{seconds / total:.1f}x real time** "
        f"({seconds:.0f} s of session) |"
    )
    lines.append(f"| ASR model + VAD load (once per worker, not in the total) | {load_s:.2f} | | {info['model']} |")
    return "\n".join(lines), info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the end-to-end session")
    parser.add_argument("--audio-rate", type=int, default=48_000, help="sample rate of the session's WAV")
    parser.add_argument("--chunk-mib", type=int, default=4, help="chunk size of the in-process upload")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(machine_line(args.seed))
    failed = False
    with bench_database() as (_tmp, media, _env, user, _token):
        table, info = table_pipeline(args, user, media)
        print(f"### A {args.minutes:g}-minute session end to end (`pipeline.process`, "
              f"{info['backend']} {info['model']})\n")  # fmt: skip
        print(f"Capture: {info['archive_mb']:.1f} MB tar, {info['events']:,} events, {info['frames']} "
              f"JPEG frames {SCREEN[0]}x{SCREEN[1]}, {info['sentences']} spoken sentences in "
              f"{args.minutes * 60:.0f} s of {args.audio_rate} Hz WAV; stored in-process in "
              f"{info['upload_s']:.2f} s before processing.\n")  # fmt: skip
        print(table + "\n")
        print(f"Result: {info['steps']} steps ({info['actions_expected']} actions generated + finished), "
              f"{info['with_screenshot']} with a screenshot, {info['with_thought']} with a thought; "
              f"{info['words']} words recognised, WER {info['wer']:.1%} against the script; "
              f"warnings {info['warnings']}, flags {info['flags']}.\n")  # fmt: skip
        if info["steps"] != info["actions_expected"] + 1:
            warn("the trajectory's step count differs from the generated actions + 1")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    run(main)
