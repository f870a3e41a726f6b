"""The command line as annotators run it (`python -m recorder`, a real subprocess): record on a real display with an
audio file, list, preview, upload, delete; login and tasks; clear errors, no tracebacks. The server here is the fake
(fault_server.py: no database needed); test_upload_django.py runs login, tasks and upload against the real one."""

from __future__ import annotations

import json
import queue
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest
import soundfile
from PIL import Image

from sandbox.actions import Click, Point

from .conftest import ROOT, cli_env, make_wav, needs_desktop, read_events, run_cli
from .fault_server import FaultInjectingServer

TOKEN = "secret-token"


class Recording:
    """`record` running in the background; its stdout lines arrive in a queue."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "recorder", "record", *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for_line(self, start: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if line.startswith(start):
                return line
        self.proc.kill()
        raise AssertionError(f"no line {start!r}; got {self.seen}; stderr: {self.proc.stderr.read()}")

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # a failed test must not leave the recorder running
            self.proc.kill()
            self.proc.wait()

    def finish(self, timeout: float = 30) -> tuple[int, str, str]:
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        assert self.proc.stderr is not None
        return rc, "".join(self.seen), self.proc.stderr.read()


@needs_desktop
def test_record_list_preview_upload_delete(shared_desktop, tmp_path):
    desktop = shared_desktop
    wav = make_wav(tmp_path / "think.wav", seconds=2.0, rate=22050)
    with FaultInjectingServer(token=TOKEN) as server:
        env = cli_env(tmp_path, THINKALOUD_SERVER=server.url, THINKALOUD_TOKEN=TOKEN)
        with Recording(
            env, "--display", f":{desktop.display}", "--audio-file", str(wav), "--duration", "3", "--interval", "0.5",
            "--instruction", "Click and type", "--indicator", "auto",
        ) as recording:  # fmt: skip
            line = recording.wait_for_line("Recording session")
            started = time.monotonic()
            assert "for 3 s" in line and "ctrl+alt+p pauses and resumes" in line
            desktop.execute(Click(Point(50, 60)))
            desktop.type_text("hi")
            rc, out, err = recording.finish()
        assert rc == 0, err
        assert 2.5 < time.monotonic() - started < 10
        assert "Traceback" not in err
        assert "indicator: window" in out  # tkinter's window on the recorded display
        session_id = line.split()[2]
        session_dir = tmp_path / "data" / "sessions" / session_id
        events = read_events(session_dir)
        kinds = [e["type"] for e in events]
        assert kinds.count("down") == 1 and [e["key"] for e in events if e["type"] == "key_down"] == ["h", "i"]
        meta = json.loads((session_dir / "session.json").read_text())
        assert meta["session_id"] == session_id and meta["instruction"] == "Click and type"
        assert meta["audio"]["file"] == "audio.wav" and 0 <= meta["audio"]["offset"] < 2
        assert soundfile.info(str(session_dir / "audio.wav")).duration == pytest.approx(2.0)

        listed = run_cli(env, "list")
        assert listed.returncode == 0 and session_id in listed.stdout and "ready" in listed.stdout

        sheet = tmp_path / "sheet.png"
        preview = run_cli(env, "preview", session_id[:8], "--sheet", str(sheet))
        assert preview.returncode == 0, preview.stderr
        assert "Click and type" in preview.stdout and "key_down 2" in preview.stdout
        assert "audio.wav, 2.0 s" in preview.stdout and "first frames/000001.jpg" in preview.stdout
        assert Image.open(sheet).format == "PNG"

        uploaded = run_cli(env, "upload", session_id)
        assert uploaded.returncode == 0, uploaded.stderr
        assert "complete, capture 101" in uploaded.stdout and "100%" in uploaded.stderr
        upload = server.upload_for(session_id)
        assert upload is not None and upload.status == "complete" and upload.instruction == "Click and type"
        assert "uploaded" in run_cli(env, "list").stdout

        deleted = run_cli(env, "delete", session_id, "--yes")
        assert deleted.returncode == 0 and not session_dir.exists()


@needs_desktop
def test_ctrl_c_stops_a_recording_cleanly(shared_desktop, tmp_path):
    env = cli_env(tmp_path)
    with Recording(
        env, "--display", f":{shared_desktop.display}", "--no-audio", "--indicator", "terminal", "--hotkey", "none",
        "--instruction", "free-form",
    ) as recording:  # fmt: skip
        line = recording.wait_for_line("Recording session")
        assert "until Ctrl-C" in line and "pauses" not in line
        recording.wait_for_line("REC ")  # the terminal status line
        recording.proc.send_signal(signal.SIGINT)
        rc, out, err = recording.finish()
    assert rc == 0 and "Stopped:" in out and "Upload it with" in out, err
    session_dir = next((tmp_path / "data" / "sessions").iterdir())
    meta = json.loads((session_dir / "session.json").read_text())
    assert meta["audio"] is None and meta["screen"]["width"] == shared_desktop.width
    assert not (session_dir / ".recording").exists()


@needs_desktop
def test_record_errors_are_one_clear_line(shared_desktop, tmp_path):
    env = cli_env(tmp_path)
    no_display = run_cli(env, "record", "--display", ":4321", "--no-audio", "--instruction", "x")
    assert no_display.returncode == 1
    assert no_display.stderr.startswith("error: cannot open X display :4321") and "Traceback" not in no_display.stderr

    display = f":{shared_desktop.display}"
    missing = run_cli(env, "record", "--display", display, "--audio-file", str(tmp_path / "x.wav"), "--instruction=x")
    assert missing.returncode == 1 and "does not exist" in missing.stderr

    import sounddevice

    try:
        sounddevice.query_devices(kind="input")
        has_microphone = True
    except Exception:
        has_microphone = False
    if not has_microphone:  # this machine has none: the default audio source must say so
        no_mic = run_cli(env, "record", "--display", display, "--duration", "1", "--instruction", "x")
        assert no_mic.returncode == 1 and "Traceback" not in no_mic.stderr
        assert "no microphone found" in no_mic.stderr and "--audio-file" in no_mic.stderr
    task = run_cli(env, "record", "--display", display, "--no-audio", "--task", "12")
    assert task.returncode == 1 and "not logged in" in task.stderr
    neither = run_cli(env, "record", "--display", display, "--no-audio")
    assert neither.returncode == 2 and "one of the arguments --task --instruction is required" in neither.stderr
    assert not list((tmp_path / "data").glob("sessions/*"))  # no failed attempt left a session behind


def test_login_tasks_and_server_errors(tmp_path):
    env = cli_env(tmp_path)
    config = tmp_path / "config" / "config.json"
    with FaultInjectingServer(token=TOKEN) as server:
        bad = run_cli(env, "login", "--server", server.url, "--token", "wrong")
        assert bad.returncode == 1 and "rejected the token (401" in bad.stderr and not config.exists()

        good = run_cli(env, "login", "--server", server.url + "/api/", "--token", TOKEN)
        assert good.returncode == 0 and "as ann (annotator)" in good.stdout
        assert json.loads(config.read_text()) == {"server": server.url, "token": TOKEN}
        assert stat.S_IMODE(config.stat().st_mode) == 0o600

        tasks = run_cli(env, "tasks")
        assert tasks.returncode == 0 and "Task 12" in tasks.stdout and "Rename the file report.txt" in tasks.stdout
        server.queue.clear()
        assert "queue is empty" in run_cli(env, "tasks").stdout

    gone = run_cli(env, "tasks")  # the server is down now
    assert gone.returncode == 1 and "cannot reach the server" in gone.stderr and "Traceback" not in gone.stderr
    assert run_cli(env, "upload", "nope").stderr.startswith("error: no session 'nope'")
    assert run_cli(env, "preview", "nope").returncode == 1


def test_the_task_instruction_comes_from_the_server(monkeypatch):
    """`record --task ID` (or `--task next`) asks the server for the task's instruction (checked without recording)."""
    from recorder import cli

    with FaultInjectingServer(token=TOKEN) as server:
        monkeypatch.setenv("THINKALOUD_SERVER", server.url)
        monkeypatch.setenv("THINKALOUD_TOKEN", TOKEN)
        for task in ("12", "next"):
            args = cli.build_parser().parse_args(["record", "--task", task])
            assert cli._task_and_instruction(args) == (12, "Rename the file report.txt")
