"""Desktop families with the sandbox's own apps (xterm, mousepad), verified by OSWorld evaluators on files.

Their state is read with a shell command in the session (`probe`): the active window's title, $HOME and the files
the task is about; the oracle decides from it (the editor's unsaved text is not readable: see docs/task-suite.md)."""

from __future__ import annotations

import random
import shlex
from typing import Any

from ..actions import Click, format_action
from .core import Family, register
from .page import SCREEN, Point, finished, hotkey, type_text
from .words import WORDS

NAMES = ("notes", "plan", "ideas", "list", "draft", "memo", "log", "summary", "todo", "diary")
DIRS = ("work", "docs", "inbox", "projects", "archive", "music", "photos", "reports")


def probe_command(paths: list[str]) -> str:
    """A shell command printing the desktop's state as JSON: active window title, $HOME, the files' contents."""
    wanted = " ".join(shlex.quote(p) for p in paths)
    script = (
        "import json,os,subprocess,sys\n"
        "def title():\n"
        "    r=subprocess.run(['xdotool','getactivewindow','getwindowname'],capture_output=True,text=True)\n"
        "    return r.stdout.strip()\n"
        "def read(p):\n"
        "    p=os.path.expanduser('~/'+p)\n"
        "    return open(p,errors='replace').read() if os.path.isfile(p) else None\n"
        "print(json.dumps({'active':title(),'home':os.path.expanduser('~'),"
        "'dirs':{p:os.path.isdir(os.path.expanduser('~/'+p)) for p in sys.argv[1:]},"
        "'files':{p:read(p) for p in sys.argv[1:]}}))\n"
    )
    return f"python3 -c {shlex.quote(script)} {wanted}"


def _content_is(path: str, text: str) -> dict[str, Any]:
    return {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": f"cat ~/{shlex.quote(path)}", "shell": True},
        "expected": {"type": "rule", "rules": {"expected": text}},
    }


def _save_as(name: str) -> str:
    """Two actions in one step: replace the dialog's name field, then save. A dialog still loading its folder may
    ignore the Enter; the next step then replaces the name again instead of appending to it."""
    return f"{hotkey('ctrl', 'a')}\n\n{type_text(name + chr(10))}"


class DesktopFamily(Family):
    """A family on the virtual desktop; `paths(spec)` are the files (and folders) its probe reads."""

    platform = "desktop"

    def paths(self, spec: dict[str, Any]) -> list[str]:
        raise NotImplementedError

    def probe(self, spec: dict[str, Any]) -> str:
        return probe_command(self.paths(spec))


@register
class TerminalFile(DesktopFamily):
    name = "terminal-file"
    app = "xterm"
    levels = (1, 2)
    summary = "in xterm, create a file holding a given word (level 2: inside a new folder, two commands)"

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        folder = rng.choice(DIRS) if difficulty == 2 else ""
        return {"name": rng.choice(NAMES) + ".txt", "word": rng.choice(WORDS), "dir": folder}

    def _path(self, spec: dict[str, Any]) -> str:
        return f"{spec['dir']}/{spec['name']}" if spec["dir"] else spec["name"]

    def instruction(self, spec: dict[str, Any]) -> str:
        if spec["dir"]:
            return (f"In the terminal, create a folder named {spec['dir']} in your home folder, and in it a file "
                    f"named {spec['name']} that contains the word {spec['word']}.")  # fmt: skip
        return (
            f"In the terminal, create a file named {spec['name']} in your home folder that contains the word "
            f"{spec['word']}."
        )

    def setup(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "launch", "parameters": {"command": ["xterm", "-maximized"]}}]

    def evaluator(self, spec: dict[str, Any]) -> dict[str, Any]:
        return _content_is(self._path(spec), spec["word"])

    def paths(self, spec: dict[str, Any]) -> list[str]:
        return [self._path(spec)] + ([spec["dir"]] if spec["dir"] else [])

    def _focus(self, state: dict[str, Any]) -> str | None:
        if "xterm" not in state["active"].lower():
            return format_action(Click(Point(SCREEN[0] // 2, SCREEN[1] // 2)))
        return None

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        path = self._path(spec)
        if (state["files"].get(path) or "").strip() == spec["word"]:
            return finished(f"{path} holds {spec['word']}")
        if focus := self._focus(state):
            return focus
        if spec["dir"] and not state["dirs"].get(spec["dir"]):
            return type_text(f"mkdir -p {spec['dir']}\n")
        return type_text(f"echo {spec['word']} > {path}\n")

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        return self._focus(state) or type_text(f"echo {spec['word']}s > {spec['name']}\n")


@register
class EditorSave(DesktopFamily):
    name = "editor-save"
    app = "mousepad"
    levels = (1,)
    summary = "type a line in mousepad and save it under a given name in the home folder"

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        return {"name": rng.choice(NAMES) + ".txt", "text": " ".join(rng.sample(WORDS, 2))}

    def instruction(self, spec: dict[str, Any]) -> str:
        return f"Type '{spec['text']}' in the text editor and save it as {spec['name']} in your home folder."

    def setup(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "launch", "parameters": {"command": ["mousepad"]}}]

    def evaluator(self, spec: dict[str, Any]) -> dict[str, Any]:
        return _content_is(spec["name"], spec["text"])

    def paths(self, spec: dict[str, Any]) -> list[str]:
        return [spec["name"]]

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        if (state["files"].get(spec["name"]) or "").strip() == spec["text"]:
            return finished(f"saved {spec['name']}")
        title = state["active"]
        if "save" in title.lower():  # the Save As dialog: its name field has the focus, its folder is the home
            return _save_as(spec["name"])
        document = title.lstrip("*").split(" - ")[0]  # "~/notes.txt", or "Untitled 1" before the first save
        if not document.startswith("Untitled") and not document.endswith("/" + spec["name"]):
            # Saved under another name (a wrong name, or one whose typing the dialog cut short): Save As, since
            # Save would keep writing that other file.
            return hotkey("ctrl", "shift", "s")
        if title.startswith("*"):  # edited, not saved yet
            return hotkey("ctrl", "s")
        return type_text(spec["text"])

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        title = state["active"]
        if "save" in title.lower():
            return _save_as(f"wrong-{spec['name']}")
        return hotkey("ctrl", "s") if title.startswith("*") else type_text(spec["text"])
