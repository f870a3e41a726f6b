"""`thinkaloud-recorder` / `python -m recorder`: log in, see your task, record a think-aloud session, list, preview,
delete and upload sessions. Expected failures print one line and exit non-zero; only bugs show a traceback."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from . import config
from .api import ApiClient
from .errors import RecorderError, SessionError
from .hotkey import DEFAULT_HOTKEY, parse_hotkey
from .session import find_session, list_sessions, sessions_dir
from .version import RECORDER


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except RecorderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thinkaloud-recorder",
        description="Record yourself solving a task while thinking aloud (screen, input, microphone), then upload it.",
    )
    parser.add_argument("--version", action="version", version=RECORDER)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("login", help="store the server URL and your API token (checked against the server)")
    p.add_argument("--server", required=True, help="the platform's URL, e.g. https://annotate.example.org")
    p.add_argument("--token", required=True, help="your API token (Think-aloud page /insitu/ or POST /api/auth/token/)")
    p.set_defaults(run=cmd_login)

    p = sub.add_parser("tasks", help="your current task (takes the next one from your queue if you have none)")
    p.add_argument("--skip", action="store_true", help="hand the current task back and take the next one")
    p.set_defaults(run=cmd_tasks)

    p = sub.add_parser("record", help="record a session until Ctrl-C (or --duration)")
    what = p.add_mutually_exclusive_group(required=True)  # the server needs one or the other with the upload
    what.add_argument("--task", help="the task's id, or 'next' for your current task from the queue")
    what.add_argument("--instruction", help="what you are going to do, for a free-form recording")
    audio = p.add_mutually_exclusive_group()
    audio.add_argument("--audio-file", type=Path, help="use this pre-recorded audio file instead of the microphone")
    audio.add_argument("--no-audio", action="store_true", help="record no audio")
    p.add_argument("--audio-device", help="microphone: a device index or name (see `python -m sounddevice`)")
    p.add_argument("--samplerate", type=int, help="microphone sample rate (default: the device's)")
    p.add_argument("--channels", type=int, default=1, help="microphone channels (default 1)")
    p.add_argument("--display", help="the X display to record (default $DISPLAY)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between periodic screenshots (0: none)")
    p.add_argument("--frame-interval", type=float, default=0.15, help="seconds between in-memory screen grabs")
    p.add_argument("--duration", type=float, help="stop by itself after this many seconds (unattended runs)")
    p.add_argument("--hotkey", default=DEFAULT_HOTKEY, help=f"pause/resume hotkey (default {DEFAULT_HOTKEY}; 'none')")
    p.add_argument("--indicator", choices=["auto", "window", "terminal", "none"], default="auto")
    p.set_defaults(run=cmd_record)

    p = sub.add_parser("list", help="the sessions recorded on this computer")
    p.set_defaults(run=cmd_list)

    p = sub.add_parser("preview", help="what a session holds: duration, events, frames, audio")
    p.add_argument("session", help="a session id (or a unique prefix of it) or its directory")
    p.add_argument("--open", action="store_true", help="write a contact sheet of its frames and open it")
    p.add_argument("--sheet", type=Path, help="write the contact sheet PNG here (without opening it)")
    p.set_defaults(run=cmd_preview)

    p = sub.add_parser("delete", help="delete a session from this computer")
    p.add_argument("session")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(run=cmd_delete)

    p = sub.add_parser("upload", help="upload a session (resumes an interrupted upload)")
    p.add_argument("session")
    p.add_argument("--delete", action="store_true", help="delete the local copy once the upload is complete")
    p.set_defaults(run=cmd_upload)
    return parser


# --- account and tasks ------------------------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> int:
    server = config.normalize_server(args.server)
    with ApiClient(server, args.token) as api:
        me = api.me()
    path = config.save(server, args.token)
    print(f"Logged in to {server} as {me.get('username')} ({me.get('role')}); saved to {path}")
    if "annotate" not in me.get("capabilities", ["annotate"]):
        print("note: this account may not annotate, so it has no task queue", file=sys.stderr)
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    login = config.require_login()
    with ApiClient(login.server or "", login.token or "") as api:
        assignment = api.next_task(skip_current=args.skip)
    if assignment is None:
        print("Your queue is empty: no task is waiting for you.")
        return 0
    task = assignment.get("task") or {}
    print(f"Task {task.get('id')}  ({task.get('platform') or '-'} / {task.get('domain') or '-'})")
    print(f"  {task.get('instruction')}")
    if apps := task.get("related_apps"):
        print(f"  apps: {', '.join(map(str, apps))}")
    print(f"Record it with: thinkaloud-recorder record --task {task.get('id')}")
    return 0


def _task_and_instruction(args: argparse.Namespace) -> tuple[int | None, str | None]:
    if args.task is None:
        return None, args.instruction
    login = config.require_login()
    with ApiClient(login.server or "", login.token or "") as api:
        if args.task == "next":
            assignment = api.next_task()
            if assignment is None:
                raise RecorderError("your queue is empty: there is no task to record")
            task = assignment["task"]
        else:
            try:
                task_id = int(args.task)
            except ValueError as exc:
                raise RecorderError(f"--task takes a task id or 'next', not {args.task!r}") from exc
            task = api.task(task_id)
    return int(task["id"]), task.get("instruction")


# --- recording --------------------------------------------------------------------------------------------------------


def cmd_record(args: argparse.Namespace) -> int:
    from .audio import AudioSource, FileAudio, Microphone
    from .capture import Capture
    from .indicator import run_indicator
    from .platforms import IS_X11
    from .x11 import open_display

    hotkey = None if args.hotkey.lower() == "none" else str(parse_hotkey(args.hotkey))
    if IS_X11:
        open_display(args.display).close()  # fail now, clearly, when there is no display
    audio: AudioSource | None = None
    if args.audio_file is not None:
        audio = FileAudio(args.audio_file)
    elif not args.no_audio:
        device: int | str | None = args.audio_device
        if isinstance(device, str) and device.isdigit():
            device = int(device)
        audio = Microphone(device, args.samplerate, args.channels)
    if audio is not None:
        audio.check()
    task_id, instruction = _task_and_instruction(args)

    directory = sessions_dir(config.data_dir()) / str(uuid.uuid4())
    capture = Capture(
        directory,
        session_id=directory.name,
        display=args.display,
        audio=audio,
        screenshot_interval=args.interval,
        frame_interval=args.frame_interval,
        hotkey=hotkey,
        task_id=task_id,
        instruction=instruction,
    )
    capture.start()
    for warning in capture.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    deadline = time.monotonic() + args.duration if args.duration else None
    how = f"for {args.duration:g} s" if args.duration else "until Ctrl-C"
    pause = f"; {hotkey} pauses and resumes" if hotkey else ""
    print(f"Recording session {directory.name} {how}{pause}", flush=True)
    failure: BaseException | None = None

    def should_stop() -> bool:
        nonlocal failure
        if capture.error is not None:
            failure = capture.error
            return True
        return stop.is_set() or (deadline is not None and time.monotonic() >= deadline)

    try:
        run_indicator(args.indicator, args.display, capture.stats, should_stop)
    finally:
        session = capture.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = session.summary()
    print(
        f"Stopped: {summary.duration:.1f} s, {sum(summary.events.values())} events, {len(summary.frames)} frames "
        f"in {session.path}"
    )
    if failure is not None:
        raise RecorderError(f"the recording stopped early: {failure}; what was captured is kept in {session.path}")
    print(f"Upload it with: thinkaloud-recorder upload {session.id}")
    return 0


# --- local sessions ---------------------------------------------------------------------------------------------------


def _when(wall: float | None) -> str:
    if not wall:
        return "-"
    return dt.datetime.fromtimestamp(wall).strftime("%Y-%m-%d %H:%M")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _state(summary: Any) -> str:
    if summary.recording:
        return "recording"
    upload = summary.upload or {}
    if upload.get("complete"):
        return "uploaded"
    if upload.get("id") is not None:
        return "upload started"
    return "interrupted" if summary.interrupted else "ready"


def cmd_list(args: argparse.Namespace) -> int:
    sessions = list_sessions(config.data_dir())
    if not sessions:
        print(f"No sessions under {sessions_dir(config.data_dir())}.")
        return 0
    print(f"{'SESSION':<36}  {'STARTED':<16}  {'LENGTH':>7}  {'ACTIONS':>7}  {'FRAMES':>6}  {'SIZE':>9}  STATE")
    for session in sessions:
        try:
            s = session.summary()
        except SessionError as exc:
            print(f"{session.path.name:<36}  unreadable: {exc}")
            continue
        actions = s.events["down"] + s.events["scroll"] + s.events["key_down"]
        print(
            f"{s.session_id:<36}  {_when(s.started_wall):<16}  {s.duration:>6.1f}s  {actions:>7}  "
            f"{len(s.frames):>6}  {_size(s.size_bytes):>9}  {_state(s)}"
        )
    return 0


def cmd_preview(args: argparse.Namespace) -> int:
    session = find_session(config.data_dir(), args.session)
    s = session.summary()
    print(f"Session     {s.session_id}  ({_state(s)})")
    print(f"Directory   {s.path}")
    print(f"Task        {s.task_id if s.task_id is not None else '-'}: {s.instruction or '-'}")
    print(f"Started     {_when(s.started_wall)}")
    print(f"Duration    {s.duration:.1f} s")
    print("Events      " + (", ".join(f"{k} {v}" for k, v in sorted(s.events.items())) or "none"))
    frames = f"{len(s.frames)}"
    if s.frames:
        frames += f" (first {s.frames[0]}, last {s.frames[-1]})"
    print(f"Frames      {frames}")
    if s.audio_file:
        length = f"{s.audio_seconds:.1f} s" if s.audio_seconds is not None else "length unknown"
        print(f"Audio       {s.audio_file}, {length}, starts at t={s.audio_offset}")
    else:
        print("Audio       none")
    print(f"Size        {_size(s.size_bytes)}")
    if s.upload:
        print(f"Upload      {s.upload.get('status')} (id {s.upload.get('id')} on {s.upload.get('server')})")
    if args.open or args.sheet:
        out = args.sheet or config.data_dir() / "previews" / f"{s.session_id}.png"
        session.contact_sheet(out)
        print(f"Contact sheet: {out}")
        if args.open and not args.sheet:
            _open_file(out)
    return 0


def _open_file(path: Path) -> None:
    """Show a file with the desktop's viewer, if there is one (best effort)."""
    try:
        if sys.platform == "darwin":
            subprocess.Popen(["open", str(path)])
        elif sys.platform == "win32":
            os.startfile(str(path))  # type: ignore[attr-defined]
        elif shutil.which("xdg-open") and os.environ.get("DISPLAY"):
            subprocess.Popen(["xdg-open", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        pass


def cmd_delete(args: argparse.Namespace) -> int:
    session = find_session(config.data_dir(), args.session)
    s = session.summary()
    if not args.yes:
        if not sys.stdin.isatty():
            raise RecorderError("pass --yes to delete without a terminal to confirm on")
        warning = "" if _state(s) == "uploaded" else " It was NOT uploaded."
        answer = input(f"Delete session {s.session_id} ({s.duration:.0f} s)?{warning} [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Kept.")
            return 1
    session.delete()
    print(f"Deleted session {s.session_id}.")
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    from .upload import upload_session

    login = config.require_login()
    session = find_session(config.data_dir(), args.session)
    bar = _ProgressBar(f"upload {session.id[:8]}")
    try:
        result = upload_session(session, login.server or "", login.token or "", progress=bar.update)
    finally:
        bar.close()
    print(
        f"Uploaded session {session.id} ({_size(result.size)}, sha256 {result.sha256[:12]}…): {result.status}"
        + (f", capture {result.capture}" if result.capture is not None else "")
        + (f" (resumed at byte {result.resumed_from})" if result.resumed_from else "")
    )
    if args.delete:
        session.delete()
        print("Deleted the local copy.")
    return 0


class _ProgressBar:
    """tqdm on a terminal, else a line per 10 %."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Any = None
        self.shown = -1

    def update(self, sent: int, total: int) -> None:
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                if self.bar is None:
                    self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=self.label)
                self.bar.n = sent
                self.bar.refresh()
                return
        tenth = sent * 10 // max(total, 1)
        if tenth != self.shown:
            self.shown = tenth
            print(f"{self.label}: {sent}/{total} bytes ({tenth * 10}%)", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


if __name__ == "__main__":
    sys.exit(main())
