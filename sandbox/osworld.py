"""OSWorld-style task setup and evaluation on a sandbox session (desktop_env's JSON format).

Setup: `config` is a list of {type, parameters}; evaluation: `evaluator` is {func, result, expected, options,
conj}, where each result/expected is a getter spec ({type, ...}) and func names a metric. Several funcs combine
with conj "and" (default) or "or". Unknown types and missing parameters raise TaskConfigError naming them.

Infeasible tasks (`func: "infeasible"`) follow OSWorld's rule: they score 1 only when the agent's last action is
FAIL (`fail()`), and any task whose agent ends with FAIL scores 0 otherwise. `call_user()` is not FAIL.
`upload_file` copies host files only from the task-files directory (`SANDBOX_TASK_FILES`, see task_files.py).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from typing import Any

from .manager import Session
from .sdk import Files, run_shell
from .task_files import TaskFileOutside, read_task_file, task_file

INFEASIBLE = "infeasible"
FAIL = "fail"  # the action name of OSWorld's FAIL in our grammar


class TaskConfigError(ValueError):
    """The task's setup or evaluator can't be run as written; the message says which entry and why."""


def _param(parameters: dict[str, Any], name: str, where: str) -> Any:
    if name not in parameters:
        raise TaskConfigError(f"{where}: missing parameter {name!r}")
    return parameters[name]


def _argv(command: Any, shell: bool) -> str:
    """A shell command line from OSWorld's `command` (a list of arguments, or a string with shell=True)."""
    if isinstance(command, list) and all(isinstance(c, str) for c in command):
        return " ".join(shlex.quote(c) for c in command)
    if isinstance(command, str):
        return command if shell else shlex.join(shlex.split(command))
    raise TaskConfigError(f"command must be a list of strings or a string, got {type(command).__name__}")


# --- setup -----------------------------------------------------------------------------------------------------------


def _desktop(session: Session, where: str) -> Any:
    if session.desktop is None:
        raise TaskConfigError(f"{where}: needs a desktop session")
    return session.desktop


def _browser(session: Session, where: str) -> Any:
    if session.browser is None:
        raise TaskConfigError(f"{where}: needs a browser session")
    return session.browser


LAUNCH_WINDOW_TIMEOUT_S = 15.0  # an app that shows no window by then failed to start (or is not an app)


def _setup_launch(session: Session, p: dict[str, Any], where: str) -> str:
    """Start an application and wait until it shows a window, so the first observation shows it; a command that
    exits with an error (not installed: 127) or never maps a window fails the setup with the reason. A launch that
    shows no window on purpose says `"wait_for_window": false`."""
    command = _param(p, "command", where)
    desktop = _desktop(session, where)
    before = len(desktop.windows())
    proc = desktop.launch(["bash", "-c", _argv(command, p.get("shell", False))])
    if not p.get("wait_for_window", True):
        return f"launched {command}"
    timeout = float(p.get("window_timeout", LAUNCH_WINDOW_TIMEOUT_S))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(desktop.windows()) > before:
            return f"launched {command}"
        code = proc.poll()
        if code is not None and code != 0:
            why = "command not found: is the application installed in the sandbox?" if code == 127 else ""
            raise TaskConfigError(f"{where}: {command!r} exited with status {code}{': ' + why if why else ''}")
        time.sleep(0.05)
    raise TaskConfigError(f"{where}: {command!r} showed no window within {timeout:g} s")


def _setup_execute(session: Session, p: dict[str, Any], where: str) -> str:
    if session.user is None:
        raise TaskConfigError(f"{where}: execute needs an isolated session")
    result = run_shell(
        session.user, _argv(_param(p, "command", where), p.get("shell", False)), timeout_s=p.get("timeout", 120)
    )
    if result.timed_out or (result.exit_code != 0 and not p.get("ignore_errors", False)):
        raise TaskConfigError(f"{where}: command failed ({result.exit_code}): {result.stderr.strip()[:300]}")
    return f"executed ({result.exit_code})"


def _setup_sleep(session: Session, p: dict[str, Any], where: str) -> str:
    seconds = float(_param(p, "seconds", where))
    if not 0 <= seconds <= 600:
        raise TaskConfigError(f"{where}: seconds must be between 0 and 600")
    time.sleep(seconds)
    return f"slept {seconds}s"


def _setup_upload(session: Session, p: dict[str, Any], where: str) -> str:
    """OSWorld's upload_file: put files of the task-files directory (`local_path`) at `path` in the session.

    Every `local_path` is checked before the first file is copied; one outside the directory refuses the step."""
    if session.user is None:
        raise TaskConfigError(f"{where}: file upload needs an isolated session")
    entries = _param(p, "files", where)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise TaskConfigError(f"{where}: files must be a list of {{local_path, path}} objects")
    contents = []
    for j, entry in enumerate(entries):
        field = f"{where}: files[{j}].local_path"
        try:
            contents.append((_param(entry, "path", where), read_task_file(_param(entry, "local_path", where))))
        except TaskFileOutside as exc:
            raise TaskConfigError(f"{field}: {exc}") from None
        except FileNotFoundError as exc:
            raise TaskConfigError(f"{field}: {exc}") from None
    files = Files(session.user)
    for path, data in contents:
        files.write(path, data)
    return f"uploaded {len(contents)} file(s)"


def check_upload_paths(p: dict[str, Any], where: str) -> None:
    """Every `local_path` of an upload_file step lies in the task-files directory, else TaskConfigError naming it."""
    entries = p.get("files") if isinstance(p, dict) else None
    for j, entry in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(entry, dict) and "local_path" in entry:
            try:
                task_file(entry["local_path"])
            except TaskFileOutside as exc:
                raise TaskConfigError(f"{where}: files[{j}].local_path: {exc}") from None


def _setup_open(session: Session, p: dict[str, Any], where: str) -> str:
    path = _param(p, "path", where)
    _desktop(session, where).launch(["xdg-open", path])
    return f"opened {path}"


SETUP: dict[str, Callable[[Session, dict[str, Any], str], str]] = {
    "launch": _setup_launch,
    "execute": _setup_execute,
    "command": _setup_execute,
    "sleep": _setup_sleep,
    "upload_file": _setup_upload,
    "open": _setup_open,
    "chrome_open_tabs": lambda session, p, where: _open_url(session, p, where),
}


def _open_url(session: Session, p: dict[str, Any], where: str) -> str:
    urls = _param(p, "urls_to_open", where)
    if not urls:
        raise TaskConfigError(f"{where}: urls_to_open is empty")
    _browser(session, where).new_page(urls[0])  # one page per session: the first URL
    return f"opened {urls[0]}"


def run_setup(session: Session, config: list[dict[str, Any]]) -> list[str]:
    """Run every setup step in order; returns what each did. All steps are checked before the first runs."""
    for i, step in enumerate(config):
        if not isinstance(step, dict) or step.get("type") not in SETUP:
            kind = step.get("type") if isinstance(step, dict) else step
            raise TaskConfigError(f"config[{i}]: unknown setup type {kind!r}; known: {', '.join(sorted(SETUP))}")
        if step["type"] == "upload_file":
            check_upload_paths(step.get("parameters", {}), f"config[{i}] (upload_file)")
    return [
        SETUP[step["type"]](session, step.get("parameters", {}), f"config[{i}] ({step['type']})")
        for i, step in enumerate(config)
    ]


# --- evaluation ------------------------------------------------------------------------------------------------------


def _get_command_output(session: Session, spec: dict[str, Any], where: str) -> str:
    if session.user is None:
        raise TaskConfigError(f"{where}: vm_command_line needs an isolated session")
    command = _argv(_param(spec, "command", where), spec.get("shell", False))
    return run_shell(session.user, command, timeout_s=spec.get("timeout", 60)).stdout


def _get_file(session: Session, spec: dict[str, Any], where: str) -> str | None:
    if session.user is None:
        raise TaskConfigError(f"{where}: vm_file needs an isolated session")
    try:
        return Files(session.user).read(_param(spec, "path", where)).decode(errors="replace")
    except FileNotFoundError:
        return None


GETTERS: dict[str, Callable[[Session, dict[str, Any], str], Any]] = {
    "vm_command_line": _get_command_output,
    "vm_file": _get_file,
    "rule": lambda session, spec, where: _param(spec, "rules", where),
    "active_url": lambda session, spec, where: _browser(session, where).url,
    "js_value": lambda session, spec, where: _browser(session, where).evaluate(_param(spec, "script", where)),
}


def _expected(rules: Any, key: str = "expected") -> Any:
    return rules.get(key) if isinstance(rules, dict) else rules


METRICS: dict[str, Callable[..., float]] = {
    "exact_match": lambda result, rules, **_: float(
        result is not None and str(result).strip() == str(_expected(rules)).strip()
    ),
    "check_include_exclude": lambda result, rules, **_: float(
        result is not None
        and all(s in result for s in rules.get("include", []))
        and not any(s in result for s in rules.get("exclude", []))
    ),
    "match_in_list": lambda result, rules, **_: float(result is not None and str(result).strip() in _expected(rules)),
    "is_in_list": lambda result, rules, **_: float(result is not None and _expected(rules) in result),
    "file_exists": lambda result, rules=None, **_: float(result is not None),
    "compare_text_file": lambda result, expected, **_: float(result is not None and result == expected),
}


def score_by_last_action(evaluator: dict[str, Any], last_action: str | None) -> float | None:
    """OSWorld's rule before any state is read: an infeasible task scores 1 only when the last action is FAIL, and a
    FAIL on any other task scores 0; None when the session's state decides. `last_action` is an action name
    ("finished", "call_user", "fail", ...), None when no agent's last action is known (which is not FAIL)."""
    funcs = evaluator.get("func") if isinstance(evaluator, dict) else None
    funcs = funcs if isinstance(funcs, list) else [funcs]
    if INFEASIBLE in funcs:
        if len(funcs) != 1:
            raise TaskConfigError(f"evaluator: {INFEASIBLE!r} stands alone; it can't be combined with other funcs")
        return float(last_action == FAIL)
    return 0.0 if last_action == FAIL else None


def evaluate(session: Session, evaluator: dict[str, Any], *, last_action: str | None = None) -> float:
    """Score the session's state against the evaluator: 1.0 or 0.0 (conj "and" / "or" over several funcs).

    `last_action`: the name of the agent's last action, for OSWorld's infeasible tasks (see score_by_last_action)."""
    if not isinstance(evaluator, dict):
        raise TaskConfigError("evaluator: must be an object like {func, result, expected}")
    funcs = evaluator.get("func")
    if funcs is None:
        raise TaskConfigError("evaluator: missing 'func'")
    decided = score_by_last_action(evaluator, last_action)
    if decided is not None:
        return decided
    several = isinstance(funcs, list)
    funcs = funcs if several else [funcs]
    results = evaluator.get("result", [{}] * len(funcs))
    expecteds = evaluator.get("expected", [None] * len(funcs))
    results, expecteds = (results, expecteds) if several else ([results], [expecteds])
    if len(results) != len(funcs) or len(expecteds) != len(funcs):
        raise TaskConfigError("evaluator: func, result and expected must have the same length")
    conj = evaluator.get("conj", "and")
    if conj not in ("and", "or"):
        raise TaskConfigError(f"evaluator: conj must be 'and' or 'or', got {conj!r}")
    scores = []
    for i, (func, result_spec, expected_spec) in enumerate(zip(funcs, results, expecteds, strict=True)):
        where = f"evaluator[{i}] ({func})"
        if func not in METRICS:
            known = ", ".join(sorted([*METRICS, INFEASIBLE]))
            raise TaskConfigError(f"{where}: unknown metric; known: {known}")
        result = _get(session, result_spec, f"{where} result")
        expected = _get(session, expected_spec, f"{where} expected") if expected_spec else None
        scores.append(METRICS[func](result, expected))
    return float(all(s == 1.0 for s in scores) if conj == "and" else any(s == 1.0 for s in scores))


def _get(session: Session, spec: dict[str, Any], where: str) -> Any:
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind not in GETTERS:
        raise TaskConfigError(f"{where}: unknown getter type {kind!r}; known: {', '.join(sorted(GETTERS))}")
    return GETTERS[kind](session, spec, where)
