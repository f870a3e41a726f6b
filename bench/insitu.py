#!/usr/bin/env python3
"""In-situ think-aloud captures: event reduction throughput, a 10-minute session end to end, and resumable uploads.

Why: a recorder session is mostly pointer motion (60 Hz), a long one runs to millions of events, the pipeline
transcribes every minute of microphone audio, and captures of hundreds of MB go up over flaky connections. Three
tables, one run (about 5 minutes on 2 cores):

  1. Event reduction throughput. A seeded synthetic 1,000,000-event log shaped like a real session (pointer moves at
     60 Hz while the hand moves, clicks, double and right clicks, drags, typing bursts with typos and backspaces,
     hotkeys, scroll gestures, a pre-action screenshot before every action, window changes, pauses). Rows: json.loads
     of every line (the baseline: the floor cost of reading the log), orjson.loads of every line (the decoder
     parse_lines uses, json.loads behind it for the lines orjson refuses), events.parse_lines (parse, check, order),
     reduce.reduce_events on the parsed events, and both; events/s, median of --repeat. Goal >= 200,000 events/s.
     The reduction is checked against the actions the generator made (same counts per action type). Events per
     CPU-second of this process sit beside the wall-clock figures: they hold up when others share the machine.
  2. A 10-minute session end to end: the same generator for 10 minutes (~130 actions, a 1280x800 JPEG before each),
     a 10-minute 48 kHz WAV with an espeak-ng think-aloud sentence every ~20 s (silence between), built with
     tests.insitu.captures.CaptureBuilder; uploaded in-process with uploads.start_upload/write_chunk into the bench
     database, then pipeline.process() in this process with the default ASR backend (model loaded beforehand, as a
     worker does once). Stages are timed from the pipeline's own Progress stage changes (plus wrappers around
     parse_lines/reduce_events/load_audio for the split); total and x real time (600 s / total).
  3. Upload throughput and resume: gunicorn as tests/servers.py starts it (gthread, 2 workers x 2 threads, DEBUG
     off) against the bench database; a ~200 MB archive (session + random frame-sized files) sent with httpx in
     4 MiB chunks through POST/PUT /api/insitu/uploads/. Rows: writing the same bytes locally in 4 MiB chunks with
     SHA-256 and fsync per chunk and a final whole-file SHA-256 (the baseline: what the server must do at least),
     uploads.start_upload/write_chunk called in-process (the server's logic without HTTP), a straight upload, and
     one cut at a seeded random byte: the client sends part of a chunk on a raw socket and resets the connection,
     reconnects, POSTs the start again (the server answers its offset) and goes on. The stored archives' SHA-256 is
     checked; MB/s, bytes re-sent, resume latency (reconnect to first accepted chunk).

Isolation: database `annotation_bench_insitu` (created and migrated when missing; the bench annotator's earlier rows
are deleted first), MEDIA_ROOT in a temporary folder, Celery/cache/channels on Redis database 10 (no worker listens
there; the processing messages the uploads queue are removed afterwards). Every process started is stopped, also on
errors and Ctrl-C.

Usage (PostgreSQL and Redis running): source scripts/env.sh && .venv/bin/python bench/insitu.py
  [--events 1000000] [--repeat 3] [--minutes 10] [--upload-mb 200] [--seed 0] [--tables 1,2,3]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import io
import itertools
import json
import logging
import math
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import jiwer
import numpy as np
import orjson
import psycopg
import soundfile
from PIL import Image, ImageDraw
from whisper.normalizers import EnglishTextNormalizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from annotation_app.insitu.audio import SAMPLE_RATE
from annotation_app.insitu.events import parse_lines
from annotation_app.insitu.reduce import reduce_events
from tests.insitu.captures import CaptureBuilder

ROOT = Path(__file__).resolve().parent.parent

BENCH_DB = "annotation_bench_insitu"
BENCH_REDIS_DB = "10"  # bench/leases.py and bench/sessions.py use 11, the tests 13-15, the app 0-3
BENCH_USER = "bench-insitu"
GOAL_EVENTS_S = 200_000
SCREEN = (1280, 800)
HZ = 60.0  # pointer sampling while the hand moves
WALL0 = 1_795_000_000.0
MB = 1e6

WORDS = (
    "quarterly report invoice total march budget draft summary folder export meeting notes sales figures "
    "customer address shipping order number password settings profile archive backup slides review"
).split()
TITLES = (
    "Inbox - Mail",
    "quarterly_report.ods - LibreOffice Calc",
    "Documents - Files",
    "Search results - Firefox",
    "Terminal",
    "Settings",
)
HOTKEYS = (("ctrl", "c"), ("ctrl", "v"), ("ctrl", "s"), ("ctrl", "z"), ("alt", "tab"), ("ctrl", "shift", "t"))
ACTIONS = {  # weight of each action the synthetic annotator takes
    "click": 38,
    "type": 17,
    "scroll": 12,
    "hotkey": 8,
    "double": 7,
    "drag": 6,
    "right": 4,
}
THOUGHTS = (
    "I need to open the file menu first",
    "the save button is greyed out so I will try the keyboard shortcut",
    "okay that did nothing, maybe the document has not changed",
    "let me type the customer name in the first field",
    "now I scroll down to find the shipping address",
    "this looks like the right folder for the quarterly report",
    "I will drag the file into the archive folder",
    "there is a warning that the file already exists",
    "I will replace it because this is the newer version",
    "next I want to export it as a PDF from the same menu",
    "the export dialog opened in a new window behind the browser",
    "I am switching to it with alt tab",
    "the total in the last row should match the invoice",
    "I am not sure which button saves the settings",
    "let me right click to see what options there are",
    "done, the report is in the downloads folder",
)


class BenchError(Exception):
    pass


def log(message: str) -> None:
    print(f"\033[1;34m==>\033[0m {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"\033[1;31m!!! {message}\033[0m", file=sys.stderr, flush=True)


# --- a synthetic session ----------------------------------------------------------------------------------------------


class Session:
    """A seeded annotator at work: events on a running monotonic clock, and the actions they must reduce to."""

    def __init__(self, seed: int, width: int = SCREEN[0], height: int = SCREEN[1]):
        self.rng = random.Random(seed)
        self.width, self.height = width, height
        self.t = 0.0
        self.x, self.y = width // 2, height // 2
        self.events: list[dict[str, Any]] = []
        self.expected: Counter[str] = Counter()
        self.frames = 0
        self.window = TITLES[0]
        self.add("window", title=self.window)

    def add(self, kind: str, **fields: Any) -> None:
        """One event as recorder/capture.py writes it (microsecond times, the wall clock beside the monotonic)."""
        self.events.append({"type": kind, "t": round(self.t, 6), "wall": round(WALL0 + self.t, 6), **fields})

    def point(self) -> tuple[int, int]:
        return self.rng.randrange(8, self.width - 8), self.rng.randrange(8, self.height - 8)

    def move_to(self, x: int, y: int, speed: float | None = None) -> None:
        """Pointer samples at 60 Hz along an eased path."""
        distance = math.hypot(x - self.x, y - self.y)
        steps = max(1, round(distance / (speed or self.rng.uniform(900, 2200)) * HZ))
        x0, y0 = self.x, self.y
        for i in range(1, steps + 1):
            self.t += 1 / HZ
            f = i / steps
            f = f * f * (3 - 2 * f)
            self.add("move", x=round(x0 + (x - x0) * f), y=round(y0 + (y - y0) * f))
        self.x, self.y = x, y

    def think(self) -> None:
        """Reading the screen between actions (>= 1.1 s, so no two actions merge): the hand drifts now and then."""
        end = self.t + 1.1 + self.rng.expovariate(1 / 2.4)
        while self.t < end:
            if self.rng.random() < 0.5:
                dx, dy = self.rng.randint(-250, 250), self.rng.randint(-180, 180)
                x = min(max(self.x + dx, 0), self.width - 1)
                y = min(max(self.y + dy, 0), self.height - 1)
                self.move_to(x, y, speed=self.rng.uniform(250, 700))
            else:
                self.t += self.rng.uniform(0.2, 0.9)
        if self.rng.random() < 0.003:  # the annotator pauses the recording
            self.add("pause")
            self.t += self.rng.uniform(5, 30)
            self.add("resume")
            self.t += 0.5

    def screenshot(self) -> None:
        self.add("screenshot", file=f"frames/{self.frames:06d}.jpg", reason="pre_action")
        self.frames += 1
        self.t += self.rng.uniform(0.01, 0.03)

    def press(self, button: str, x: int, y: int, hold: float | None = None) -> None:
        self.add("down", x=x, y=y, button=button)
        self.t += hold or self.rng.uniform(0.06, 0.14)
        self.add("up", x=x, y=y, button=button)

    def key(self, name: str) -> None:
        self.add("key_down", key=name)
        self.t += self.rng.uniform(0.03, 0.08)
        self.add("key_up", key=name)
        self.t += self.rng.uniform(0.04, 0.16)

    def approach(self) -> tuple[int, int]:
        self.think()
        x, y = self.point()
        self.move_to(x, y)
        self.t += self.rng.uniform(0.05, 0.25)
        self.screenshot()
        return x, y

    def click(self) -> None:
        x, y = self.approach()
        self.press("left", x, y)
        self.expected["click"] += 1
        if self.rng.random() < 0.05:  # a click that brings another window to the front
            self.t += 0.2
            self.switch_window()

    def double(self) -> None:
        x, y = self.approach()
        self.press("left", x, y)
        self.t += self.rng.uniform(0.06, 0.2)
        self.press("left", x, y)
        self.expected["left_double"] += 1

    def right(self) -> None:
        x, y = self.approach()
        self.press("right", x, y)
        self.expected["right_single"] += 1

    def drag(self) -> None:
        x, y = self.approach()
        self.add("down", x=x, y=y, button="left")
        self.t += 0.1
        while True:
            tx, ty = self.point()
            if math.hypot(tx - x, ty - y) > 60:
                break
        self.move_to(tx, ty, speed=self.rng.uniform(300, 900))
        self.t += 0.08
        self.add("up", x=tx, y=ty, button="left")
        self.expected["drag"] += 1

    def type(self) -> None:
        """Click into a field, then type a few words with the odd typo fixed by backspace; enter sometimes."""
        self.click()
        self.t += self.rng.uniform(0.3, 0.8)
        self.screenshot()
        text = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 5)))
        for i, ch in enumerate(text):
            if self.rng.random() < 0.04:
                self.key(self.rng.choice("qwertyuiopasdfghjklzxcvbnm"))
                self.t += self.rng.uniform(0.2, 0.5)
                self.key("backspace")
            if i == 0 and self.rng.random() < 0.3:
                self.add("key_down", key="shift")
                self.t += 0.05
                self.key(ch.upper())
                self.add("key_up", key="shift")
                self.t += 0.05
            else:
                self.key(ch)
        if self.rng.random() < 0.4:
            self.key("enter")
        self.expected["type"] += 1

    def hotkey(self) -> None:
        self.think()
        self.screenshot()
        keys = self.rng.choice(HOTKEYS)
        for name in keys[:-1]:
            self.add("key_down", key=name)
            self.t += 0.05
        self.key(keys[-1])
        for name in reversed(keys[:-1]):
            self.add("key_up", key=name)
            self.t += 0.03
        self.expected["hotkey"] += 1
        if keys == ("alt", "tab"):
            self.switch_window()

    def scroll(self) -> None:
        x, y = self.approach()
        dy = self.rng.choice((1, -1, -1))
        for _ in range(self.rng.randint(1, 10)):
            self.add("scroll", x=x, y=y, dx=0, dy=dy)
            self.t += self.rng.uniform(0.03, 0.12)
        self.expected["scroll"] += 1

    def switch_window(self) -> None:
        self.window = self.rng.choice([t for t in TITLES if t != self.window])
        self.add("window", title=self.window)

    def act(self) -> None:
        kind = self.rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
        getattr(self, kind)()

    @classmethod
    def of_events(cls, seed: int, events: int) -> Session:
        session = cls(seed)
        while len(session.events) < events:  # whole actions: a few events more than asked
            session.act()
        return session

    @classmethod
    def of_seconds(cls, seed: int, seconds: float) -> Session:
        session = cls(seed)
        while session.t < seconds - 12:
            session.act()
        session.t = max(session.t, seconds - 0.5)
        session.add("move", x=session.x, y=session.y)
        return session


def jsonl(events: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events).encode()


def reduced_counts(actions: list[Any]) -> Counter[str]:
    return Counter(a.action.name for a in actions)


# --- table 1: event reduction throughput ------------------------------------------------------------------------------


def median_rate(fn: Callable[[], Any], events: int, repeat: int) -> tuple[tuple[float, float], Any]:
    """(events per wall second, events per CPU second of this process), medians of `repeat` runs; the last result."""
    wall, cpu, result = [], [], None
    for _ in range(repeat):
        result = None
        gc.collect()
        started, started_cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return (events / statistics.median(wall), events / statistics.median(cpu)), result


def table_reduction(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    log(f"generating a session of {args.events:,}+ events (seed {args.seed})")
    session = Session.of_events(args.seed, args.events)
    n = len(session.events)
    kinds = Counter(e["type"] for e in session.events)
    blob = jsonl(session.events)
    span, expected = session.events[-1]["t"], session.expected
    del session
    gc.collect()

    def read() -> list[Any]:
        return [json.loads(line) for line in io.BytesIO(blob)]

    def read_orjson() -> list[Any]:
        return [orjson.loads(line) for line in io.BytesIO(blob)]

    def parse() -> Any:
        return parse_lines(io.BytesIO(blob))

    log("json.loads / orjson.loads / parse_lines / reduce_events / both, median of " + str(args.repeat))
    base_rate = median_rate(read, n, args.repeat)[0]  # results dropped at once: no extra objects for the GC
    orjson_rate = median_rate(read_orjson, n, args.repeat)[0]
    parse_rate, parsed = median_rate(parse, n, args.repeat)
    reduce_rate, reduction = median_rate(lambda events=parsed.events: reduce_events(events), n, args.repeat)
    del parsed
    both_rate = median_rate(lambda: reduce_events(parse().events), n, args.repeat)[0]
    got = reduced_counts(reduction.actions)
    info = {
        "events": n,
        "mb": len(blob) / MB,
        "span_h": span / 3600,
        "moves": kinds["move"] / n,
        "kinds": kinds,
        "actions": len(reduction.actions),
        "warnings": reduction.warnings,
        "expected": expected,
        "got": got,
        "reduced_right": got == expected,
    }
    rows = [
        ("`json.loads` of every line (baseline: reading the log)", base_rate, ""),
        ("`orjson.loads` of every line (the decoder parse_lines uses)", orjson_rate, ""),
        ("`events.parse_lines` (parse + check + order)", parse_rate, f">= {GOAL_EVENTS_S:,}"),
        ("`reduce.reduce_events` on the parsed events", reduce_rate, f">= {GOAL_EVENTS_S:,}"),
        ("parse + reduce", both_rate, f">= {GOAL_EVENTS_S:,}"),
    ]
    lines = [
        "| step | events/s | vs baseline | goal | met | events/CPU-s | vs baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (rate, cpu_rate), goal in rows:
        met = "" if not goal else ("yes" if rate >= GOAL_EVENTS_S else "**NO**")
        lines.append(
            f"| {name} | {rate:,.0f} | {rate / base_rate[0]:.2f}x | {goal} | {met} | {cpu_rate:,.0f} | "
            f"{cpu_rate / base_rate[1]:.2f}x |"
        )
    return "\n".join(lines), info


# --- environment: database, Django, Redis -----------------------------------------------------------------------------


def project_env(media: Path) -> dict[str, str]:
    """scripts/env.sh's environment, pointed at the bench database, media folder and Redis database; DEBUG off."""
    out = subprocess.run(
        ["bash", "-c", "source scripts/env.sh >/dev/null && env -0"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    for name in ("ASR_BACKEND", "ASR_MODEL_PATH", "INSITU_ASR_BACKEND", "INSITU_ASR_MODEL", "INSITU_REFINE"):
        env.pop(name, None)  # the default ASR backend and model, no refinement
    env.update(
        DATABASE_NAME=BENCH_DB,
        MEDIA_ROOT=str(media),
        REDIS_DB_CELERY=BENCH_REDIS_DB,
        REDIS_DB_CACHE=BENCH_REDIS_DB,
        REDIS_DB_CHANNELS=BENCH_REDIS_DB,
        DJANGO_SETTINGS_MODULE="annotation_app.settings",
        DJANGO_DEBUG="0",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def prepare_database(env: dict[str, str]) -> None:
    conninfo = {
        "host": env.get("PGHOST", "127.0.0.1"),
        "port": env["PGPORT"],
        "user": env["DATABASE_USER"],
        "password": env["DATABASE_PASSWORD"],
    }
    with psycopg.connect(**conninfo, dbname="postgres", autocommit=True) as conn:
        if conn.execute("select 1 from pg_database where datname = %s", (BENCH_DB,)).fetchone() is None:
            log(f"creating database {BENCH_DB}")
            conn.execute(f'create database "{BENCH_DB}"')
    log(f"manage.py migrate ({BENCH_DB})")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    import django

    django.setup()
    for name in ("httpx", "faster_whisper"):  # one line per request or file would drown the tables
        logging.getLogger(name).setLevel(logging.WARNING)


def bench_user() -> tuple[Any, str]:
    """The bench annotator with an API token, without the rows earlier runs left (their media folders are gone)."""
    from rest_framework.authtoken.models import Token

    from annotation_app.models import Role, User

    user, _ = User.objects.get_or_create(username=BENCH_USER, defaults={"role": Role.ANNOTATOR})
    clean_user(user)
    token, _ = Token.objects.get_or_create(user=user)
    return user, token.key


def clean_user(user: Any) -> None:
    from annotation_app.models import Capture, Task, Trajectory

    Trajectory.objects.filter(annotator=user).delete()
    Task.objects.filter(created_by=user).delete()
    Capture.objects.filter(annotator=user).delete()


def remove_queued(env: dict[str, str], capture_ids: set[int]) -> int:
    """Take the bench's processing messages out of the `asr` queue of the bench's Redis database."""
    import redis

    client = redis.Redis.from_url(f"{env['REDIS_URL']}/{BENCH_REDIS_DB}")
    removed = 0
    for raw in client.lrange("asr", 0, -1):
        try:
            headers = json.loads(raw)["headers"]
        except (ValueError, KeyError):
            continue
        if headers.get("task") == "annotation_app.asr.process_capture" and headers.get("argsrepr") in {
            f"({pk},)" for pk in capture_ids
        }:
            removed += client.lrem("asr", 1, raw)
    if client.llen("asr") == 0:
        client.delete(*client.keys("_kombu.binding*") or ["_kombu.binding.asr"])
    return removed


# --- table 2: a 10-minute session through the pipeline ----------------------------------------------------------------


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


def build_session_capture(args: argparse.Namespace, tmp: Path) -> tuple[bytes, CaptureBuilder, Session, str]:
    seconds = args.minutes * 60.0
    session = Session.of_seconds(args.seed + 1, seconds)
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
    archive = builder.archive(audio=wav.getvalue(), session={"screen": screen, "recorder": "bench/insitu.py"})
    return archive, builder, session, ". ".join(script)


def word_error_rate(reference: str, hypothesis: str) -> float:
    """WER as bench/asr.py and tests/insitu/test_asr.py measure it: jiwer after Whisper's English normaliser."""
    normalize = EnglishTextNormalizer()
    return jiwer.wer(normalize(reference), normalize(hypothesis))


@contextmanager
def patched(module: Any, name: str, wrapper: Callable[[Any], Any]) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, wrapper(original))
    try:
        yield
    finally:
        setattr(module, name, original)


def upload_in_process(user: Any, data: bytes, chunk: int) -> tuple[Any, float]:
    """The capture stored through uploads.start_upload/write_chunk without HTTP; (capture, seconds)."""
    from annotation_app.insitu import uploads
    from annotation_app.models import Capture

    digest = hashlib.sha256(data).hexdigest()  # the recorder knows it before the upload starts
    started = time.perf_counter()
    enqueued: list[int] = []
    with patched(uploads, "_enqueue", lambda _original: enqueued.append):  # nothing is sent to Celery
        capture, _ = uploads.start_upload(
            user, session_id=uuid.uuid4(), size=len(data), sha256=digest,
            instruction="Export the quarterly report as a PDF into the downloads folder",
        )  # fmt: skip
        for offset in range(0, len(data), chunk):
            part = data[offset : offset + chunk]
            capture = uploads.write_chunk(
                capture.pk, user, content_range=f"bytes {offset}-{offset + len(part) - 1}/{len(data)}",
                sha256=hashlib.sha256(part).hexdigest(), body=part,
            )  # fmt: skip
    seconds = time.perf_counter() - started
    if capture.status != Capture.Status.QUEUED or enqueued != [capture.pk]:
        raise BenchError(f"the in-process upload ended {capture.status}, enqueued {enqueued}")
    return capture, seconds


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


# --- table 3: uploads -------------------------------------------------------------------------------------------------


def random_archive(args: argparse.Namespace, tmp: Path) -> bytes:
    """A capture-shaped tar of about --upload-mb: session.json, events.jsonl and frame-sized random files."""
    rng = np.random.default_rng(args.seed + 3)
    builder = CaptureBuilder(tmp, instruction="Upload benchmark")
    builder.events = Session.of_seconds(args.seed + 4, 300).events
    total, i = 0, 0
    while total < args.upload_mb * MB:
        data = rng.bytes(int(rng.integers(600_000, 1_400_000)))
        builder.frames[f"frames/{i:06d}.jpg"] = data
        total += len(data)
        i += 1
    return builder.archive()


def local_floor(data: bytes, chunk: int, path: Path) -> float:
    """The least the server does per upload: SHA-256 and fsync per chunk, then SHA-256 of the whole file."""
    started = time.perf_counter()
    with path.open("wb") as out:
        for offset in range(0, len(data), chunk):
            part = data[offset : offset + chunk]
            hashlib.sha256(part).hexdigest()
            out.write(part)
            out.flush()
            os.fsync(out.fileno())
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            sha.update(block)
    sha.hexdigest()
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


class Uploader:
    """The upload protocol of docs/in-situ.md over httpx, one client (connection) at a time."""

    def __init__(self, base: str, token: str, data: bytes, chunk: int):
        self.base, self.data, self.chunk = base, data, chunk
        self.headers = {"Authorization": f"Token {token}"}
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.put_s: list[float] = []

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers=self.headers, timeout=120)

    def start(self, client: httpx.Client, session_id: str) -> dict[str, Any]:
        body = {"session_id": session_id, "size": len(self.data), "sha256": self.sha256, "instruction": "bench"}
        response = client.post("/api/insitu/uploads/", json=body)
        if response.status_code not in (200, 201):
            raise BenchError(f"POST /api/insitu/uploads/ answered {response.status_code}: {response.text[:500]}")
        return response.json()

    def chunk_headers(self, offset: int) -> tuple[bytes, dict[str, str]]:
        part = self.data[offset : offset + self.chunk]
        return part, {
            "Content-Range": f"bytes {offset}-{offset + len(part) - 1}/{len(self.data)}",
            "X-Chunk-Sha256": hashlib.sha256(part).hexdigest(),
            "Content-Type": "application/octet-stream",
        }

    def put(self, client: httpx.Client, pk: int, offset: int) -> dict[str, Any]:
        part, headers = self.chunk_headers(offset)
        started = time.perf_counter()
        response = client.put(f"/api/insitu/uploads/{pk}/", content=part, headers=headers)
        self.put_s.append(time.perf_counter() - started)
        if response.status_code != 200:
            raise BenchError(f"PUT at {offset} answered {response.status_code}: {response.text[:500]}")
        return response.json()

    def abort_mid_chunk(self, port: int, pk: int, offset: int, cut: int) -> None:
        """Send the chunk at `offset` only up to byte `cut` on a raw socket, then reset the connection."""
        part, headers = self.chunk_headers(offset)
        head = f"PUT /api/insitu/uploads/{pk}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in {**self.headers, **headers}.items())
        head += f"Content-Length: {len(part)}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(head.encode() + part[: cut - offset])
            time.sleep(0.05)  # let the server start reading the body
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST

    def straight(self) -> dict[str, Any]:
        self.put_s = []
        started = time.perf_counter()
        with self.client() as client:
            state = self.start(client, str(uuid.uuid4()))
            while state["offset"] < len(self.data):
                state = self.put(client, state["id"], state["offset"])
        seconds = time.perf_counter() - started
        return {
            "seconds": seconds,
            "state": state,
            "put_p50": statistics.median(self.put_s),
            "last_put": self.put_s[-1],
            "resent": 0,
        }

    def interrupted(self, port: int, cut: int) -> dict[str, Any]:
        self.put_s = []
        session_id = str(uuid.uuid4())
        started = time.perf_counter()
        with self.client() as client:
            state = self.start(client, session_id)
            while state["offset"] + self.chunk <= cut:
                state = self.put(client, state["id"], state["offset"])
        pk, at = state["id"], state["offset"]
        self.abort_mid_chunk(port, pk, at, cut)
        reconnect = time.perf_counter()
        with self.client() as client:
            state = self.start(client, session_id)
            resumed_at = state["offset"]
            resume_post = time.perf_counter() - reconnect
            state = self.put(client, pk, state["offset"])
            first_accepted = time.perf_counter() - reconnect
            while state["offset"] < len(self.data):
                state = self.put(client, pk, state["offset"])
        seconds = time.perf_counter() - started
        return {
            "seconds": seconds,
            "state": state,
            "put_p50": statistics.median(self.put_s),
            "cut": cut,
            "chunk_start": at,
            "resumed_at": resumed_at,
            "resent": cut - resumed_at,
            "resume_post_s": resume_post,
            "resume_s": first_accepted,
        }


def stored_sha256(media: Path, pk: int) -> str:
    sha = hashlib.sha256()
    with (media / f"captures/{pk}/capture.tar").open("rb") as f:
        while block := f.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()


@contextmanager
def gunicorn(env: dict[str, str], port: int, log_path: Path) -> Iterator[str]:
    from tests.servers import answers, running

    base = f"http://127.0.0.1:{port}"
    command = [str(Path(sys.executable).parent / "gunicorn"), "annotation_app.wsgi:application"]
    command += ["--bind", f"127.0.0.1:{port}", "--worker-class", "gthread", "--workers", "2", "--threads", "2"]
    command += ["--control-socket", str(log_path.with_suffix(".ctl"))]  # not the shared ~/.gunicorn/gunicorn.ctl
    log(" ".join(command[1:]) + f"  (log: {log_path})")
    with running(command, env, log_path, answers(f"{base}/healthz")):
        yield base


def table_uploads(
    args: argparse.Namespace, env: dict[str, str], user: Any, token: str, media: Path
) -> tuple[str, dict[str, Any]]:
    from tests.servers import free_port

    chunk = args.chunk_mib << 20
    with tempfile.TemporaryDirectory(prefix="bench-insitu-") as tmp:
        data = random_archive(args, Path(tmp))
    size = len(data)
    cut = random.Random(args.seed + 5).randrange(size // 10, size * 9 // 10)
    log(f"archive {size / MB:.1f} MB; local floor x3")
    floor = statistics.median(local_floor(data, chunk, media / "floor.bin") for _ in range(3))
    log("in-process start_upload/write_chunk (no HTTP)")
    _capture, in_process = upload_in_process(user, data, chunk)
    port = free_port()
    server_log = media.parent / "gunicorn.log"
    uploader = Uploader(f"http://127.0.0.1:{port}", token, data, chunk)
    ids: set[int] = set()
    try:
        with gunicorn(env, port, server_log):
            log("warming up both workers with small uploads")
            for _ in range(4):
                small = Uploader(uploader.base, token, data[: 256 << 10], chunk).straight()
                ids.add(small["state"]["id"])
            log("straight upload")
            straight = uploader.straight()
            ids.add(straight["state"]["id"])
            log(f"upload cut at byte {cut:,}, then resumed")
            cut_run = uploader.interrupted(port, cut)
            ids.add(cut_run["state"]["id"])
    finally:
        server_text = server_log.read_text(errors="replace") if server_log.exists() else ""
        removed = remove_queued(env, ids) if ids else 0
    for run in (straight, cut_run):
        pk = run["state"]["id"]
        if run["state"]["status"] != "queued" or stored_sha256(media, pk) != uploader.sha256:
            raise BenchError(f"capture {pk}: status {run['state']['status']}, stored archive checksum wrong")
    if cut_run["resumed_at"] != cut_run["chunk_start"]:
        raise BenchError(f"the server resumed at {cut_run['resumed_at']}, not {cut_run['chunk_start']}")
    errors = [line for line in server_text.splitlines() if re.search(r" (ERROR|CRITICAL) ", line)]
    log_copy = ROOT / "bench/results/insitu-gunicorn.log"
    log_copy.parent.mkdir(exist_ok=True)
    log_copy.write_text(server_text)
    info = {
        "size": size,
        "chunk": chunk,
        "cut": cut,
        "cut_run": cut_run,
        "last_put": straight["last_put"],
        "removed": removed,
        "ids": sorted(ids),
        "server_errors": errors,
        "checksums_ok": True,
    }
    chunks = math.ceil(size / chunk)
    lines = [
        "| run | seconds | MB/s | vs baseline | PUT p50 ms | bytes re-sent after the cut | resume latency ms |",
        "|---|---|---|---|---|---|---|",
        f"| local write: SHA-256 + fsync per {args.chunk_mib} MiB chunk, whole-file SHA-256 (baseline) | {floor:.2f} "
        f"| {size / MB / floor:.0f} | 1.00x | | | |",
        f"| `uploads.start_upload` + `write_chunk` in-process (the server's logic without HTTP) | {in_process:.2f} "
        f"| {size / MB / in_process:.0f} | {floor / in_process:.2f}x | {in_process / chunks * 1000:.0f} (mean) | | |",
    ]
    for name, r in (("straight upload", straight), (f"cut at byte {cut:,}, resumed", cut_run)):
        rate = size / MB / r["seconds"]
        resent = f"{r['resent']:,}" if "cut" in r else ""
        resume = f"{r['resume_s'] * 1000:.0f} (POST {r['resume_post_s'] * 1000:.0f})" if "cut" in r else ""
        lines.append(
            f"| {name} | {r['seconds']:.2f} | {rate:.0f} | {rate / (size / MB / floor):.2f}x | "
            f"{r['put_p50'] * 1000:.0f} | {resent} | {resume} |"
        )
    return "\n".join(lines), info


# --- main -------------------------------------------------------------------------------------------------------------


def interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the throughput log")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs; the median counts")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the end-to-end session")
    parser.add_argument("--audio-rate", type=int, default=48_000, help="sample rate of the session's WAV")
    parser.add_argument("--upload-mb", type=float, default=200.0, help="size of the uploaded archive")
    parser.add_argument("--chunk-mib", type=int, default=4, help="upload chunk size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tables", default="1,2,3", help="which tables to measure")
    args = parser.parse_args()
    tables = {int(t) for t in args.tables.split(",") if t.strip()}
    signal.signal(signal.SIGTERM, interrupt)

    cpus = len(os.sched_getaffinity(0))
    print(f"Machine: {platform.processor() or platform.machine()}, {cpus} CPUs, load average before the run "
          f"{os.getloadavg()[0]:.2f}; Python {platform.python_version()}; seed {args.seed}\n")  # fmt: skip
    failed = False
    if 1 in tables:
        table, info = table_reduction(args)
        print(f"### 1. Event reduction throughput ({info['events']:,} events, median of {args.repeat})\n")
        kinds = ", ".join(f"{k} {v:,}" for k, v in info["kinds"].most_common())
        print(f"Synthetic log: {info['mb']:.0f} MB of JSON Lines, {info['span_h']:.1f} h of session, "
              f"{info['moves']:.0%} pointer moves; {kinds}; reduced to {info['actions']:,} actions.\n")  # fmt: skip
        print(table + "\n")
        expected = ", ".join(f"{k} {v}" for k, v in sorted(info["expected"].items()))
        print(f"Reduction check, {sum(info['expected'].values()):,} actions generated: "
              f"{'as generated' if info['reduced_right'] else 'WRONG'} ({expected}).\n")  # fmt: skip
        if not info["reduced_right"]:
            warn(f"reduce_events gave {dict(info['got'])}, the generator made {dict(info['expected'])}")
            failed = True
        if info["warnings"]:
            print(f"Reduction warnings: {info['warnings'][:3]}\n")
    if tables & {2, 3}:
        with tempfile.TemporaryDirectory(prefix="bench-insitu-") as tmp:
            media = Path(tmp) / "media"
            media.mkdir()
            env = project_env(media)
            prepare_database(env)
            setup_django(env)
            user, token = bench_user()
            try:
                if 2 in tables:
                    table, info = table_pipeline(args, user, media)
                    print(f"### 2. A {args.minutes:g}-minute session end to end (`pipeline.process`, "
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
                if 3 in tables:
                    table, info = table_uploads(args, env, user, token, media)
                    r = info["cut_run"]
                    print(f"### 3. Upload throughput and resume ({info['size'] / MB:.1f} MB archive, "
                          f"{info['chunk'] >> 20} MiB chunks, gunicorn gthread 2x2 on loopback)\n")  # fmt: skip
                    print(table + "\n")
                    print(f"Cut at byte {r['cut']:,} (seed {args.seed}), inside the chunk at {r['chunk_start']:,}; "
                          f"the server answered offset {r['resumed_at']:,} on reconnect. Both stored archives match "
                          f"the SHA-256; {info['removed']} queued processing message(s) removed from Redis db "
                          f"{BENCH_REDIS_DB}. The straight upload's last PUT (whole-file SHA-256) took "
                          f"{info['last_put'] * 1000:.0f} ms. Server log records at ERROR: "
                          f"{len(info['server_errors'])} (bench/results/insitu-gunicorn.log).\n")  # fmt: skip
                    for line in info["server_errors"][:5]:
                        print(f"    {line}")
            finally:
                clean_user(user)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        warn(str(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        warn("interrupted")
        sys.exit(130)
