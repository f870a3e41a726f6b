"""Tiny checkpoints built from a config (no download) and expert demonstrations, shared by the trainer tests."""

from __future__ import annotations

import pytest

from training.evaluate import write_demonstrations
from training.policy.tiny import build_tiny_checkpoint, build_tiny_text_checkpoint


@pytest.fixture(scope="session")
def tiny_text(tmp_path_factory):
    return build_tiny_text_checkpoint(tmp_path_factory.mktemp("tiny-text") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_vision(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-vl") / "model", seed=0)


@pytest.fixture(scope="session")
def demos(tmp_path_factory):
    path = tmp_path_factory.mktemp("demos") / "copy.jsonl"
    write_demonstrations("copy", 256, path)
    return path
