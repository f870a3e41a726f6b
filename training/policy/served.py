"""The models one embedded policy server holds: loaded by name from checkpoints under its models roots, so a newly
trained checkpoint (the flywheel writes them under var/flywheel-runs) is served without a restart.

Checkpoints load only from directories under a `--models-root` (resolved, so `..` and symlinks cannot leave it):
the load endpoint must not become a way to read arbitrary files into the server. With a state file (`--state`) the
loaded models are written down and loaded again when the server restarts, so a promoted model keeps being served.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}")


class Engine(Protocol):
    """What the registry needs of a loaded model (training.policy.server.PolicyEngine)."""

    name: str
    checkpoint: Path

    def card(self) -> dict[str, Any]: ...


class LoadError(Exception):
    """A load or unload the server will not do; `status` is its HTTP status (400, 403, 404 or 409)."""

    def __init__(self, message: str, status: int, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def checkpoint_under(path_text: str, roots: list[Path]) -> Path:
    """The resolved checkpoint directory `path_text` names, when it lies under one of `roots` and holds a
    config.json; LoadError (403 outside every root, 400 not a checkpoint) says why not."""
    if not roots:
        raise LoadError("this server loads no checkpoints: start it with --models-root DIR", 403, "checkpoint")
    try:
        resolved = Path(path_text).resolve()
        allowed = [root.resolve() for root in roots]
    except (OSError, ValueError) as exc:
        raise LoadError(f"checkpoint {path_text!r} is not a usable path: {exc}", 400, "checkpoint") from None
    if not any(resolved.is_relative_to(root) for root in allowed):
        names = ", ".join(str(root) for root in allowed)
        raise LoadError(
            f"checkpoint {path_text!r} is not under a models root of this server ({names})", 403, "checkpoint"
        )
    if not (resolved / "config.json").is_file():
        raise LoadError(f"no checkpoint at {path_text!r}: it has no config.json", 400, "checkpoint")
    return resolved


class ServedModels:
    """Engines by served name; the first one added is the default (a request that names no model gets it)."""

    def __init__(self, roots: list[Path], *, max_models: int = 8, state: Path | None = None) -> None:
        self.roots = list(roots)
        self.max_models = max_models
        self.state = state  # where the loaded models are written down (None: nowhere)
        self.restoring = False  # while restoring, the file keeps every entry until all were tried
        self.engines: dict[str, Engine] = {}
        self.default = ""
        self.lock = threading.Lock()  # guards `engines`
        self.loading = threading.Lock()  # one load at a time: two requests for a name never load it twice

    def add(self, engine: Engine) -> None:
        """Serve `engine` under its name (the first becomes the default)."""
        with self.lock:
            self.engines[engine.name] = engine
            self.default = self.default or engine.name

    def get(self, model: str | None) -> Engine | None:
        """The engine a request naming `model` goes to; no name means the default; None when not served."""
        with self.lock:
            return self.engines.get(model or self.default)

    def cards(self) -> list[dict[str, Any]]:
        with self.lock:
            return [engine.card() for engine in self.engines.values()]

    def load(self, name: str, checkpoint: str, build: Callable[[Path, str], Engine]) -> tuple[dict[str, Any], bool]:
        """Load `checkpoint` as `name` with `build(path, name)`: (its card, whether it was newly loaded). The same
        name and checkpoint again is a no-op; the name on another checkpoint is a 409 (unload it first)."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise LoadError(
                "model must be a name of 1 to 200 letters, digits and . _ : / @ + - (starting with a letter or digit)",
                400,
                "model",
            )
        path = checkpoint_under(checkpoint, self.roots)
        with self.loading:
            existing = self.get(name)
            if existing is not None:
                if Path(existing.checkpoint).resolve() == path:
                    return existing.card(), False
                raise LoadError(
                    f"the model `{name}` is already served from {existing.checkpoint}: DELETE /v1/models/{name} first",
                    409,
                    "model",
                )
            if len(self.engines) >= self.max_models:
                raise LoadError(
                    f"this server holds {len(self.engines)} models (--max-models {self.max_models}): "
                    "DELETE /v1/models/<name> one first",
                    409,
                )
            try:
                engine = build(path, name)
            except Exception as exc:  # a broken checkpoint is the caller's input: say what went wrong
                raise LoadError(f"the checkpoint at {checkpoint!r} does not load: {exc}", 400, "checkpoint") from exc
            self.add(engine)
            self._save()
            return engine.card(), True

    def unload(self, name: str) -> None:
        """Stop serving `name` (404 when not served; 409 for the default, which requests without a model use)."""
        with self.lock:
            if name not in self.engines:
                raise LoadError(f"The model `{name}` does not exist.", 404, "model")
            if name == self.default:
                raise LoadError(f"`{name}` is this server's default model: it cannot be unloaded", 409, "model")
            del self.engines[name]
        self._save()

    def _save(self) -> None:
        """Write {name: checkpoint} of the loaded models (the startup one aside) to the state file, atomically."""
        if self.state is None or self.restoring:
            return
        with self.lock:
            loaded = {n: str(e.checkpoint) for n, e in self.engines.items() if n != self.default}
        self.state.parent.mkdir(parents=True, exist_ok=True)
        partial = self.state.with_name(self.state.name + ".partial")
        partial.write_text(json.dumps({"models": loaded}, indent=1))
        os.replace(partial, self.state)

    def restore(self, build: Callable[[Path, str], Engine]) -> list[str]:
        """Load again the models the state file names (each still checked against the roots); what could not be
        loaded is left out, and the returned lines say why."""
        if self.state is None or not self.state.is_file():
            return []
        try:
            models = json.loads(self.state.read_text())["models"]
            entries = [(str(name), str(path)) for name, path in models.items()]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return [f"state file {self.state} is unreadable ({exc}): no model restored"]
        problems = []
        self.restoring = True
        try:
            for name, path in entries:
                try:
                    self.load(name, path, build)
                except LoadError as exc:
                    problems.append(f"{name} not restored: {exc}")
        finally:
            self.restoring = False
        self._save()  # what is served now
        return problems
