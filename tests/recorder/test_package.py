"""The recorder is its own package: it builds and installs from recorder/ alone, gives the `thinkaloud-recorder`
command, and never imports Django (it runs on annotators' computers, not next to the platform)."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from .conftest import ROOT


def test_no_django_anywhere():
    for path in (ROOT / "recorder").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            assert not any(n.split(".")[0] in ("django", "annotation_app", "sandbox") for n in names), (path, names)
    code = "import sys, recorder, recorder.cli, recorder.upload, recorder.capture; print(sorted(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "django" not in loaded.stdout


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="building needs setuptools")
def test_pip_installs_the_package_and_its_command(tmp_path):
    source = tmp_path / "src" / "recorder"  # a copy: an in-tree build writes build/ and *.egg-info next to the code
    shutil.copytree(ROOT / "recorder", source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", source], check=True)
    (wheel,) = (tmp_path / "dist").glob("thinkaloud_recorder-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "recorder/capture.py" in names and "recorder/__main__.py" in names
    assert "thinkaloud-recorder = recorder.cli:main" in entry_points

    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    version = subprocess.run(
        [site / "bin" / "thinkaloud-recorder", "--version"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.strip() == "thinkaloud-recorder 0.1.0"
    where = subprocess.run(
        [sys.executable, "-c", "import recorder; print(recorder.__file__)"], cwd=tmp_path, env=env, capture_output=True,
        text=True,
    )  # fmt: skip
    assert where.stdout.strip() == str(site / "recorder" / "__init__.py")
