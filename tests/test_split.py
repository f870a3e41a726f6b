"""scripts/test's split of the suite (tests/split.py): a file that starts desktops or sandbox services must run in
the sandboxed process, one after another with the others like it; a file that does not is free to run beside them."""

from __future__ import annotations

from . import split
from .split import TESTS, starts_sandboxes


def test_the_files_that_start_sandboxes_are_in_the_sandboxed_process():
    for relative in (
        "sandbox/test_desktop.py",  # a directory where every file does
        "recorder/test_capture.py",  # takes the recorder's `desktop` fixture
        "recorder/test_cli.py",  # takes its module-scoped `shared_desktop`
        "live/test_annotator_walk_browser.py",  # the live services' fixtures
        "curation/test_replay.py",  # starts a sandbox service itself
    ):
        assert starts_sandboxes(TESTS / relative), relative


def test_the_files_that_start_none_run_beside_them():
    for relative in ("recorder/test_upload_django.py", "recorder/test_parts.py", "test_roles_walk_browser.py"):
        assert not starts_sandboxes(TESTS / relative), relative


def test_every_test_file_is_listed_by_exactly_one_half(capsys):
    halves = {}
    for half in ("sandbox", "other"):
        assert split.main([half]) == 0
        halves[half] = set(capsys.readouterr().out.split())
    every = {str(path.relative_to(TESTS.parent)) for path in split.test_files()}
    assert not halves["sandbox"] & halves["other"]
    assert halves["sandbox"] | halves["other"] == every
    assert "tests/test_split.py" in halves["other"] and "tests/sandbox/test_actions.py" in halves["sandbox"]
    assert split.main(["both"]) == 2
