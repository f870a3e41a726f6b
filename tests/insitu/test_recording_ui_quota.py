"""The capture quota is checked when a browser capture starts, not only at upload: a full quota refuses the start
(413, said on the Think-aloud page, no capture made) and Record (413 from the API, which the page shows)."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse

from annotation_app.insitu import browser, uploads
from annotation_app.models import Capture
from annotation_app.upload_checks import UploadRejected

from ..conftest import api_client_for
from ..factories import AssignmentFactory


@pytest.fixture
def full(db, settings):
    """An annotator holding a task whose captures fill their quota exactly."""
    settings.MAX_USER_CAPTURE_BYTES = 2 * 2**20
    assignment = AssignmentFactory()
    big = Capture.objects.create(
        annotator=assignment.annotator, session_id=uuid.uuid4(), size=2 * 2**20, sha256="0" * 64
    )
    return assignment.annotator, big


def test_a_full_quota_refuses_a_new_browser_capture_on_the_page(full, client):
    annotator, big = full
    with pytest.raises(UploadRejected, match=r"fill your quota \(2.0 MiB of 2.0 MiB\)") as refused:
        browser.open_browser_capture(annotator)
    assert refused.value.status == 413
    client.force_login(annotator)
    response = client.post(reverse("insitu-browser-start"))
    body = response.content.decode()
    assert response.status_code == 413 and 'id="start-error"' in body and "Delete captures you no longer need" in body
    assert not Capture.objects.filter(source=Capture.Source.BROWSER).exists()
    big.size = 2**20  # room again: the start goes ahead
    big.save()
    response = client.post(reverse("insitu-browser-start"))
    assert response.status_code == 302 and Capture.objects.filter(source=Capture.Source.BROWSER).count() == 1


def test_record_is_refused_once_the_quota_filled_meanwhile(full):
    annotator, big = full
    capture = Capture.objects.create(
        annotator=annotator, session_id=uuid.uuid4(), size=0, sha256="", source=Capture.Source.BROWSER,
        status=Capture.Status.RECORDING, stage=Capture.STAGE_READY, meta={"sandbox_session": "s-1"},
    )  # fmt: skip
    response = api_client_for(annotator).post(reverse("insitu-record", args=[capture.pk]))
    assert response.status_code == 413 and "fill your quota" in response.json()["detail"]
    big.delete()
    uploads.check_room(annotator)  # nothing used: room
