"""Fixtures of the recorder tests: real Xvfb desktops (sandbox.desktop), generated audio, the CLI's environment.
Only test_upload_django.py touches the database (the real upload endpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from sandbox.desktop import Desktop, available

ROOT = Path(__file__).resolve().parents[2]

needs_desktop = pytest.mark.skipif(not available(), reason="needs Xvfb, openbox and x11vnc (scripts/bootstrap)")


def make_wav(path: Path, seconds: float = 3.0, rate: int = 16000) -> Path:
    """A mono 16-bit WAV: a 440 Hz tone with a little noise (deterministic)."""
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(0).normal(0, 0.01, t.shape)
    soundfile.write(str(path), (0.3 * np.sin(2 * np.pi * 440 * t) + noise).astype("float32"), rate, subtype="PCM_16")
    return path


def read_events(session_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (session_dir / "events.jsonl").read_text().splitlines()]


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The CLI's environment: its data and config in tmp_path, no login unless given, the repo on sys.path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THINKALOUD_")}
    env.update(
        THINKALOUD_HOME=str(tmp_path / "data"),
        THINKALOUD_CONFIG=str(tmp_path / "config" / "config.json"),
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def run_cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recorder", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def desktop(tmp_path):
    desktop = Desktop.start(tmp_path / "home")
    yield desktop
    desktop.stop()


@pytest.fixture(scope="module")
def shared_desktop(tmp_path_factory):
    """One desktop for a module's tests that only need a display to exist (saves starting one per test)."""
    desktop = Desktop.start(tmp_path_factory.mktemp("desktop"))
    yield desktop
    desktop.stop()
