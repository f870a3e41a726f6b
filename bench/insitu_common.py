"""Shared parts of the in-situ benches (insitu_reduce.py, insitu_pipeline.py, insitu_upload.py): a seeded synthetic
annotator session, the bench database and Redis database, the bench user, gunicorn, and small helpers.

Isolation: database `annotation_bench_insitu` (created and migrated when missing; the bench annotator's earlier rows
are deleted first), MEDIA_ROOT in a temporary folder, Celery/cache/channels on Redis database 10 (no worker listens
there; the processing messages the uploads queue are removed afterwards). Every process started is stopped, also on
errors and Ctrl-C.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import random
import signal
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

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BENCH_DB = "annotation_bench_insitu"
BENCH_REDIS_DB = "10"  # see docs/operations.md for which Redis database each user of Redis takes
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


def machine_line(seed: int) -> str:
    cpus = len(os.sched_getaffinity(0))
    return (
        f"Machine: {platform.processor() or platform.machine()}, {cpus} CPUs, load average before the run "
        f"{os.getloadavg()[0]:.2f}; Python {platform.python_version()}; seed {seed}\n"
    )


def interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(main: Callable[[], int]) -> None:
    """Run a bench's main: exit 1 on a BenchError, 130 on Ctrl-C or SIGTERM (servers it started are stopped)."""
    signal.signal(signal.SIGTERM, interrupt)
    try:
        sys.exit(main())
    except BenchError as exc:
        warn(str(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        warn("interrupted")
        sys.exit(130)


# --- a synthetic session ----------------------------------------------------------------------------------------------


class SyntheticSession:
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
    def of_events(cls, seed: int, events: int) -> SyntheticSession:
        session = cls(seed)
        while len(session.events) < events:  # whole actions: a few events more than asked
            session.act()
        return session

    @classmethod
    def of_seconds(cls, seed: int, seconds: float) -> SyntheticSession:
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


@contextmanager
def bench_database() -> Iterator[tuple[Path, Path, dict[str, str], Any, str]]:
    """The bench's own database, migrated, with Django set up on it and a temporary folder whose media/ is
    MEDIA_ROOT; yields (folder, media, environment, bench user, the user's API token) and removes the user's rows."""
    with tempfile.TemporaryDirectory(prefix="bench-insitu-") as tmp:
        media = Path(tmp) / "media"
        media.mkdir()
        env = project_env(media)
        prepare_database(env)
        setup_django(env)
        user, token = bench_user()
        try:
            yield Path(tmp), media, env, user, token
        finally:
            clean_user(user)


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
