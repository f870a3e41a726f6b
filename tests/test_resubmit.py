"""Fixing a rejected trajectory: its annotator sees the verdict and comment, fixes the thoughts (on the trajectory
page for a live one, on the capture's timeline for an in-situ one) and resubmits, or attempts the task again; the
trajectory goes back to submitted and its review history is kept. Only its own annotator may do any of it."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse

from annotation_app import trajectories
from annotation_app.insitu import timeline
from annotation_app.models import Assignment, Capture, Review, Task, Trajectory
from annotation_app.task_queue import current_assignment, next_task

from .conftest import api_client_for
from .factories import StepFactory, TaskFactory, TrajectoryFactory


@pytest.fixture
def rejected(annotator, lead):
    """A live trajectory of two steps that the data lead rejected, its task completed by the annotator."""
    task = TaskFactory(status=Task.Status.COMPLETED)
    Assignment.objects.create(task=task, annotator=annotator, status=Assignment.Status.COMPLETED)
    trajectory = TrajectoryFactory(task=task, annotator=annotator, status=Trajectory.Status.SUBMITTED)
    StepFactory(trajectory=trajectory, index=0, thought="click it")
    StepFactory(trajectory=trajectory, index=1, thought="")
    trajectories.review(trajectory, lead, Review.Verdict.REJECT, score=2, comment="Step 1 has no thought.")
    trajectory.refresh_from_db()
    return trajectory


def test_fixing_and_resubmitting_keeps_the_review_and_the_thought_before(rejected, annotator, lead):
    changed = trajectories.fix_thoughts(rejected, annotator, {1: "  now   type the  name ", 0: "click it"})
    assert [s.index for s in changed] == [1]
    assert rejected.steps.get(index=1).thought == "now type the name"
    trajectories.fix_thoughts(rejected, annotator, {1: "type the name"})  # a second edit keeps the first original
    rejected.refresh_from_db()
    assert rejected.metadata["thoughts_before_fix"] == {"1": ""}
    assert trajectories.resubmit(rejected, annotator).status == Trajectory.Status.SUBMITTED
    rejected.refresh_from_db()
    assert rejected.status == Trajectory.Status.SUBMITTED and len(rejected.metadata["resubmitted"]) == 1
    assert list(rejected.reviews.values_list("verdict", flat=True)) == ["reject"]
    with pytest.raises(trajectories.Conflict, match="Only a rejected trajectory"):
        trajectories.resubmit(rejected, annotator)  # once is enough: it waits for a new review
    trajectories.review(rejected, lead, Review.Verdict.APPROVE)
    assert list(rejected.reviews.order_by("created_at").values_list("verdict", flat=True)) == ["reject", "approve"]


def test_fixes_are_refused_with_reasons(rejected, annotator, make_user):
    with pytest.raises(trajectories.Invalid, match="Step 7 does not exist"):
        trajectories.fix_thoughts(rejected, annotator, {7: "x"})
    with pytest.raises(trajectories.Invalid, match="at most 5,000"):
        trajectories.fix_thoughts(rejected, annotator, {0: "x" * 5001})
    with pytest.raises(trajectories.Conflict, match="own annotator"):
        trajectories.fix_thoughts(rejected, make_user("annotator"), {0: "x"})
    rejected.status = Trajectory.Status.APPROVED
    rejected.save()
    with pytest.raises(trajectories.Conflict, match="this one is approved"):
        trajectories.fix_thoughts(rejected, annotator, {0: "x"})
    assert rejected.steps.get(index=0).thought == "click it"


def test_attempting_again_hands_the_task_back(rejected, annotator, make_user):
    other_task = TaskFactory()
    next_task(annotator)  # holds another task
    with pytest.raises(trajectories.Conflict, match=f"You hold task #{other_task.pk}"):
        trajectories.attempt_again(rejected, annotator)
    held = TrajectoryFactory(task=other_task, annotator=annotator)
    StepFactory(trajectory=held, index=0)
    trajectories.submit(held)  # submitting completes the task they held
    assignment = trajectories.attempt_again(rejected, annotator)
    assert assignment.task_id == rejected.task_id and current_assignment(annotator) == assignment
    assert Task.objects.get(pk=rejected.task_id).status == Task.Status.ASSIGNED
    assert trajectories.attempt_again(rejected, annotator) == assignment  # twice: the same assignment
    rejected.refresh_from_db()
    assert rejected.status == Trajectory.Status.REJECTED  # the rejected attempt stays as it was


def test_attempting_again_is_refused_for_an_archived_or_held_task(rejected, annotator, make_user):
    someone = make_user("annotator")
    Assignment.objects.create(task=rejected.task, annotator=someone)
    with pytest.raises(trajectories.Conflict, match="another annotator"):
        trajectories.attempt_again(rejected, annotator)
    Assignment.objects.filter(annotator=someone).update(status=Assignment.Status.EXPIRED)
    Task.objects.filter(pk=rejected.task_id).update(status=Task.Status.ARCHIVED)
    with pytest.raises(trajectories.Conflict, match="archived"):
        trajectories.attempt_again(rejected, annotator)


def test_the_pages_fix_and_resubmit_a_live_trajectory(client, rejected, annotator):
    client.force_login(annotator)
    queue = client.get(reverse("annotate")).content.decode()
    assert "Step 1 has no thought." in queue and "Fix and resubmit" in queue
    page = client.get(reverse("trajectory", args=[rejected.pk])).content.decode()
    assert 'id="fix-form"' in page and "Step 1 has no thought." in page
    response = client.post(reverse("trajectory-fix", args=[rejected.pk]), {"thought-1": "x" * 5001, "resubmit": "1"})
    assert response.status_code == 400 and "at most 5,000" in response.content.decode()
    fixed = {"thought-1": "Type the name.", "resubmit": "1"}
    response = client.post(reverse("trajectory-fix", args=[rejected.pk]), fixed)
    assert response.status_code == 302
    rejected.refresh_from_db()
    assert rejected.status == Trajectory.Status.SUBMITTED and rejected.steps.get(index=1).thought == "Type the name."
    page = client.get(reverse("trajectory", args=[rejected.pk])).content.decode()
    assert "submitted for review again" in page and 'id="fix-form"' not in page and "Before the fix: (empty)" in page
    response = client.post(reverse("trajectory-fix", args=[rejected.pk]), {"thought-1": "again", "resubmit": "1"})
    assert response.status_code == 409 and "Only a rejected trajectory" in response.content.decode()


def test_the_page_hands_the_task_back_for_a_new_attempt(client, rejected, annotator):
    client.force_login(annotator)
    response = client.post(reverse("trajectory-retry", args=[rejected.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("annotate")
    page = client.get(reverse("annotate")).content.decode()
    assert f"Task #{rejected.task_id} is yours again" in page and rejected.task.instruction in page


def test_an_in_situ_trajectory_is_fixed_on_its_timeline(client, rejected, annotator):
    rejected.mode = Trajectory.Mode.IN_SITU
    rejected.save()
    capture = Capture.objects.create(
        annotator=annotator, session_id=uuid.uuid4(), size=10, sha256="0" * 64, trajectory=rejected,
        status=Capture.Status.SUBMITTED, meta={"screen": {"width": 100, "height": 80}},
    )  # fmt: skip
    client.force_login(annotator)
    page = client.get(reverse("trajectory", args=[rejected.pk])).content.decode()
    assert reverse("insitu-capture-page", args=[capture.pk]) in page and 'id="fix-form"' not in page
    timeline_page = client.get(reverse("insitu-capture-page", args=[capture.pk])).content.decode()
    assert "Resubmit for review" in timeline_page and "Step 1 has no thought." in timeline_page
    api = api_client_for(annotator)
    url = reverse("insitu-thought", args=[capture.pk, 1])
    assert api.put(url, {"thought": "Type the name."}, format="json").status_code == 200
    assert api.post(reverse("insitu-submit", args=[capture.pk])).status_code == 200
    rejected.refresh_from_db()
    assert rejected.status == Trajectory.Status.SUBMITTED and rejected.metadata["thoughts_before_fix"] == {"1": ""}
    assert api.put(url, {"thought": "later"}, format="json").status_code == 409  # read-only until a new verdict
    assert not timeline.fixable(Capture.objects.get(pk=capture.pk))


ROLE_CODES = {"anonymous": 302, "annotator": 404, "data_lead": 403, "ml_engineer": 403, "superuser": 404}


@pytest.mark.parametrize("name", ["trajectory-fix", "trajectory-retry"])
@pytest.mark.parametrize("role", list(ROLE_CODES))
def test_only_the_own_annotator_may_fix_or_retry(name, role, rejected, make_user, client):
    """Every role but the trajectory's own annotator is refused, and nothing changes."""
    if role != "anonymous":
        client.force_login(make_user(role))
    response = client.post(reverse(name, args=[rejected.pk]), {"thought-0": "hijacked", "resubmit": "1"})
    assert response.status_code == ROLE_CODES[role]
    if role == "anonymous":
        assert response["Location"].startswith(reverse("login"))
    rejected.refresh_from_db()
    assert rejected.status == Trajectory.Status.REJECTED and rejected.steps.get(index=0).thought == "click it"
    assert not Assignment.objects.filter(status=Assignment.Status.ACTIVE).exists()
