"""The layering rule: `sandbox/`, `training/` and `recorder/` never import Django. Every module of each package is
imported in a fresh interpreter (entry points run with --help), and Django must not be loaded after any of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .servers import ROOT

DJANGO_FREE = ("sandbox", "training", "recorder")

# Modules that cannot be imported on a CPU machine, each with why (none today: vLLM is only called as a program).
NOT_IMPORTABLE_HERE: dict[str, str] = {}

CHECK = """
import importlib, json, runpy, sys
for name in json.loads(sys.argv[1]):
    if name.endswith(".__main__"):
        sys.argv = [name, "--help"]
        try:
            runpy.run_module(name, run_name="__main__")
        except SystemExit:
            pass
    else:
        importlib.import_module(name)
    if "django" in sys.modules:
        sys.exit("importing " + name + " loaded django")
"""


def modules(package: str) -> list[str]:
    """Every module of `package`, found on disk (nothing is imported here)."""
    names = []
    for path in sorted((ROOT / package).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if name not in NOT_IMPORTABLE_HERE:
            names.append(name)
    return names


def test_every_module_is_found():
    found = [name for package in DJANGO_FREE for name in modules(package)]
    assert {"sandbox.actions", "sandbox.service", "training.ppo", "training.policy.server", "recorder.upload"} <= set(
        found
    )
    assert "recorder.__main__" in found and len(found) >= 50


@pytest.mark.parametrize("package", DJANGO_FREE)
def test_package_never_imports_django(package):
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"} | {"PYTHONPATH": str(ROOT)}
    names = modules(package)
    result = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps(names)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
