"""The annotator's queue page: skipping ends an open live session, skipped tasks can be un-skipped, and their own
trajectories show the reviewer's verdict and a way back into a live session that is still open."""

from __future__ import annotations

import pytest
from django.urls import reverse

from annotation_app.models import Assignment, LiveSession, Review, Task, Trajectory
from annotation_app.task_queue import next_task

from .factories import TaskFactory, TrajectoryFactory


@pytest.fixture
def annotator_client(client, annotator):
    client.force_login(annotator)
    return client


def test_skipping_a_task_ends_its_open_live_session(annotator_client, annotator):
    task = TaskFactory()
    TaskFactory()  # something to get next
    next_task(annotator)
    trajectory = TrajectoryFactory(task=task, annotator=annotator, mode=Trajectory.Mode.INTERACTIVE)
    session = LiveSession.objects.create(trajectory=trajectory, status=LiveSession.Status.ACTIVE)
    response = annotator_client.post(reverse("annotate-next"), {"skip": "1"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    session.refresh_from_db()
    trajectory.refresh_from_db()
    assert (session.status, session.end_reason) == (LiveSession.Status.ENDED, "skipped")
    assert trajectory.status == Trajectory.Status.ABANDONED
    assert Assignment.objects.get(task=task, annotator=annotator).status == Assignment.Status.SKIPPED


def test_when_only_skipped_tasks_are_left_the_page_says_so_and_offers_to_unskip(annotator_client, annotator):
    task = TaskFactory()
    next_task(annotator)
    body = annotator_client.post(reverse("annotate-next"), {"skip": "1"}, HTTP_HX_REQUEST="true").content.decode()
    assert "Only tasks you skipped are left (1)" in body and reverse("annotate-unskip") in body
    assert "No pending tasks" not in body
    body = annotator_client.post(reverse("annotate-unskip"), HTTP_HX_REQUEST="true").content.decode()
    assert task.instruction in body  # handed out again
    assert Assignment.objects.filter(task=task, annotator=annotator, status=Assignment.Status.ACTIVE).exists()
    assert Assignment.objects.filter(status=Assignment.Status.UNSKIPPED).count() == 1
    assert Task.objects.get(pk=task.pk).status == Task.Status.ASSIGNED


def test_an_empty_queue_still_says_so(annotator_client):
    body = annotator_client.post(reverse("annotate-next"), HTTP_HX_REQUEST="true").content.decode()
    assert "No pending tasks are left" in body and reverse("annotate-unskip") not in body


def test_my_trajectories_show_the_review_and_a_resume_link(annotator_client, annotator, lead):
    reviewed = TrajectoryFactory(annotator=annotator, status=Trajectory.Status.REJECTED)
    Review.objects.create(trajectory=reviewed, reviewer=lead, verdict="rejected", score=2, comment="Step 3 is wrong.")
    open_one = TrajectoryFactory(annotator=annotator, mode=Trajectory.Mode.INTERACTIVE)
    LiveSession.objects.create(trajectory=open_one, status=LiveSession.Status.ACTIVE)
    body = annotator_client.get(reverse("annotate")).content.decode()
    assert "Step 3 is wrong." in body and "2/5" in body
    assert reverse("live", args=[open_one.pk]) in body and "Resume" in body
