"""The visible "recording" indicator: a small always-on-top tkinter window where a GUI is available, else a status
line in the terminal (elapsed time, actions, events, frames, paused). It runs the CLI's main loop.

The window lives in a child process (`python -m recorder.indicator DISPLAY`, fed status lines on stdin): Xlib ends a
process whose display connection breaks, so only the child can die that way; the recording then carries on with the
terminal line. Nothing the GUI does can stop the recording.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from .capture import Stats

StatsFn = Callable[[], Stats]
StopFn = Callable[[], bool]
TICK_S = 0.25


def status_line(stats: Stats) -> str:
    minutes, seconds = divmod(int(stats.elapsed), 60)
    state = "PAUSED" if stats.paused else "REC"
    events = sum(stats.events.values())
    return f"{state} {minutes:02d}:{seconds:02d}  {stats.actions} actions  {events} events  {stats.frames} frames"


class TerminalIndicator:
    """Rewrites one status line on a terminal; on a pipe (logs, tests) prints a line every `every` seconds and on
    each pause/resume."""

    def __init__(self, out: TextIO | None = None, every: float = 5.0) -> None:
        self.out = out or sys.stdout
        self.every = every

    def run(self, stats: StatsFn, should_stop: StopFn) -> None:
        tty = self.out.isatty()
        last_print, last_paused = 0.0, None
        try:
            while not should_stop():
                current = stats()
                now = time.monotonic()
                if tty:
                    self.out.write("\r\033[K" + status_line(current))
                    self.out.flush()
                elif now - last_print >= self.every or current.paused != last_paused:
                    print(status_line(current), file=self.out, flush=True)
                    last_print = now
                last_paused = current.paused
                time.sleep(TICK_S)
        finally:
            if tty:
                self.out.write("\n")
                self.out.flush()


class IndicatorUnavailable(Exception):
    """No window can be shown (no tkinter, no display)."""


class WindowIndicator:
    """The parent's side of the indicator window: starts the child, sends it status lines, falls back to the
    terminal if the child goes away."""

    def __init__(self, display: str | None, out: TextIO | None = None, timeout: float = 10.0) -> None:
        self.out = out
        package_parent = str(Path(__file__).resolve().parent.parent)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])),
        }
        self.child = subprocess.Popen(
            [sys.executable, "-m", "recorder.indicator", display or ""],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,  # Ctrl-C is for the recorder; the window goes when its stdin closes
        )  # fmt: skip
        ready: list[str] = []
        reader = threading.Thread(
            target=lambda: ready.append(self.child.stdout.readline() if self.child.stdout else "")
        )
        reader.start()
        reader.join(timeout)
        if not ready or ready[0].strip() != "ready":
            self.close()
            error = (self.child.stderr.read() if self.child.stderr else "").strip().splitlines()
            raise IndicatorUnavailable(error[-1] if error else "the indicator window did not start")

    def run(self, stats: StatsFn, should_stop: StopFn) -> None:
        try:
            while not should_stop():
                current = stats()
                assert self.child.stdin is not None
                self.child.stdin.write(("P" if current.paused else "R") + status_line(current) + "\n")
                self.child.stdin.flush()
                time.sleep(TICK_S)
        except (OSError, ValueError, AssertionError):  # the window's process is gone (e.g. its display broke)
            TerminalIndicator(self.out).run(stats, should_stop)
        finally:
            self.close()

    def close(self) -> None:
        try:
            if self.child.stdin is not None:
                self.child.stdin.close()
        except OSError:
            pass
        try:
            self.child.wait(3.0)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


def run_indicator(
    kind: str, display: str | None, stats: StatsFn, should_stop: StopFn, out: TextIO | None = None
) -> str:
    """Show the indicator `kind` (auto | window | terminal | none) until `should_stop()`; returns the kind shown."""
    if kind in ("auto", "window"):
        try:
            window = WindowIndicator(display, out)
        except (IndicatorUnavailable, OSError) as exc:  # no tkinter, no display: the terminal will do
            if kind == "window":
                print(f"no indicator window ({exc}); showing the status here", file=out or sys.stderr)
        else:
            print("indicator: window", file=out or sys.stdout, flush=True)
            window.run(stats, should_stop)
            return "window"
    if kind == "none":
        while not should_stop():
            time.sleep(TICK_S)
        return "none"
    TerminalIndicator(out).run(stats, should_stop)
    return "terminal"


def _window(display: str) -> int:
    """The child: a borderless always-on-top window in the screen's top-right corner, red while recording and grey
    while paused, updated from stdin until it closes. Not managed by the window manager, so it never takes the focus
    (it does appear in the screenshots)."""
    import queue
    import tkinter

    root = tkinter.Tk(screenName=display or None, className="thinkaloud-recorder")
    root.title("thinkaloud-recorder")
    root.withdraw()
    root.overrideredirect(True)
    root.attributes("-topmost", True)
    label = tkinter.Label(root, text="● REC", fg="white", bg="#c62828", font=("TkDefaultFont", 9), padx=6)
    label.pack()
    root.update_idletasks()
    root.geometry(f"+{root.winfo_screenwidth() - 300}+4")
    root.deiconify()
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()

    def update() -> None:
        latest = ""
        try:
            while True:
                line = lines.get_nowait()
                if line is None:
                    root.quit()
                    return
                latest = line
        except queue.Empty:
            pass
        if latest:
            paused = latest.startswith("P")
            label.configure(text=("❚❚ " if paused else "● ") + latest[1:], bg="#616161" if paused else "#c62828")
            root.lift()
        root.after(int(TICK_S * 1000), update)

    print("ready", flush=True)
    root.after(0, update)
    root.mainloop()
    root.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(_window(sys.argv[1] if len(sys.argv) > 1 else ""))
