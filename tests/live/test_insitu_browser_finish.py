"""Finishing a browser think-aloud capture on the real sandbox service: the desktop is given back only once the
capture's archive is written and the capture queued, so a failure on the way keeps it."""

from __future__ import annotations

import tarfile

import pytest

from annotation_app.insitu import browser
from annotation_app.insitu.uploads import archive_file
from annotation_app.models import Capture

from .conftest import needs_desktop
from .test_insitu_browser_start import held, leased, started  # noqa: F401 (held is a fixture)

pytestmark = [needs_desktop]


def test_an_archive_that_cannot_be_written_keeps_the_desktop(held, live_settings):  # noqa: F811
    assignment, _ = held
    capture = started(browser.open_browser_capture(assignment.annotator))
    session = capture.meta["sandbox_session"]
    try:
        browser.start_recording(capture)
        capture.refresh_from_db()
        archive_file(capture).mkdir(parents=True)  # a directory where the archive goes: writing it fails
        with pytest.raises(IsADirectoryError):
            browser.finish_recording(capture, None, 0.0)
        assert leased(capture, session)  # the desktop was not released before the archive was written
        capture.refresh_from_db()
        assert capture.status == Capture.Status.RECORDING  # not queued: cancelling gives the desktop back
    finally:
        browser.abandon(capture)
    assert not leased(capture, session)


def test_a_finished_capture_is_written_then_its_desktop_released(held, live_settings):  # noqa: F811
    assignment, _ = held
    capture = started(browser.open_browser_capture(assignment.annotator))
    session = capture.meta["sandbox_session"]
    browser.start_recording(capture)
    capture.refresh_from_db()
    capture = browser.finish_recording(capture, None, 0.0)
    assert capture.status == Capture.Status.QUEUED and capture.size == archive_file(capture).stat().st_size
    with tarfile.open(archive_file(capture)) as archive:
        assert "session.json" in archive.getnames()
    assert not leased(capture, session)
