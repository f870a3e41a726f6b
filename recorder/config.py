"""Where the recorder keeps things: the user config file (server URL and token, mode 0600) and the data directory
(sessions), each overridable by environment variables for unattended runs and tests."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import RecorderError

ENV_SERVER = "THINKALOUD_SERVER"  # overrides the stored server URL
ENV_TOKEN = "THINKALOUD_TOKEN"  # overrides the stored token
ENV_HOME = "THINKALOUD_HOME"  # the data directory (sessions)
ENV_CONFIG = "THINKALOUD_CONFIG"  # the config file (default ~/.config/thinkaloud/config.json, or under XDG_CONFIG_HOME)


@dataclass(frozen=True)
class Config:
    server: str | None
    token: str | None


def config_path() -> Path:
    if explicit := os.environ.get(ENV_CONFIG):
        return Path(explicit).expanduser()
    if sys.platform == "win32" and os.environ.get("APPDATA"):
        base = Path(os.environ["APPDATA"])
    else:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "thinkaloud" / "config.json"


def data_dir() -> Path:
    """The directory holding the sessions (created on demand)."""
    if explicit := os.environ.get(ENV_HOME):
        return Path(explicit).expanduser()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "thinkaloud"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "thinkaloud"


def normalize_server(url: str) -> str:
    """`https://host/` or `https://host/api` -> `https://host` (the API paths are appended to it)."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise RecorderError(f"the server URL must start with http:// or https://, not {url!r}")
    return url.removesuffix("/api")


def load() -> Config:
    """The stored login, with the environment's overrides applied."""
    stored: dict[str, object] = {}
    path = config_path()
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise RecorderError(f"cannot read the config file {path}: {exc}") from exc
    server = os.environ.get(ENV_SERVER) or stored.get("server")
    token = os.environ.get(ENV_TOKEN) or stored.get("token")
    return Config(
        normalize_server(server) if isinstance(server, str) and server else None,
        token if isinstance(token, str) and token else None,
    )


def save(server: str, token: str) -> Path:
    """Store the login in the config file, readable by its owner only (it holds the API token)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"server": normalize_server(server), "token": token}, out, indent=2)
    os.chmod(tmp, 0o600)  # an existing tmp file keeps its old mode through O_CREAT
    os.replace(tmp, path)
    return path


def require_login() -> Config:
    config = load()
    if not config.server or not config.token:
        raise RecorderError(
            "not logged in: run `thinkaloud-recorder login --server URL --token KEY` "
            f"(or set {ENV_SERVER} and {ENV_TOKEN})"
        )
    return config
