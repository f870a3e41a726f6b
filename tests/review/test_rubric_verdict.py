"""Rubrics per project and the trajectory verdict: parsing, checks with their messages, recording, send-back."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from annotation_app import rubric
from annotation_app.models import Assignment, ProjectSettings, Review, ReviewAssignment, Role, Task, Trajectory
from tests.conftest import api_client_for
from tests.factories import TaskFactory, TrajectoryFactory


def test_rubric_parsing_reports_every_problem():
    ok = rubric.parse_rubric('[{"key": "clicks_precise", "label": "Clicks precise", "min": 0, "max": 3}]')
    assert ok == [{"key": "clicks_precise", "label": "Clicks precise", "min": 0, "max": 3}]
    assert rubric.parse_rubric("") == []
    with pytest.raises(rubric.RubricError) as bad_json:
        rubric.parse_rubric("[{")
    assert "not valid JSON" in bad_json.value.messages[0]
    with pytest.raises(rubric.RubricError) as bad:
        rubric.parse_rubric(
            [{"key": "A b", "min": 1, "max": 5}, {"key": "x", "min": 5, "max": 1}, {"key": "x", "max": 2.5}, 7]
        )
    assert len(bad.value.messages) == 5  # the key used twice too
    with pytest.raises(rubric.RubricError):
        rubric.parse_rubric({"key": "x"})


def test_scores_are_checked_against_the_rubric():
    criteria = rubric.DEFAULT_RUBRIC
    assert rubric.parse_scores(criteria, {"efficient": "4"}, complete=False) == {"efficient": 4}
    with pytest.raises(rubric.RubricError) as missing:
        rubric.parse_scores(criteria, {"efficient": "4"}, complete=True)
    assert len(missing.value.messages) == 2
    with pytest.raises(rubric.RubricError) as out:
        rubric.parse_scores(criteria, {"efficient": "6", "task_completed": "x", "speed": "1"}, complete=False)
    assert len(out.value.messages) == 3 and any("out of range" in m for m in out.value.messages)


def test_a_reject_needs_a_reason():
    scores = {"task_completed": 1, "efficient": 2, "thoughts_explain_actions": 3}
    with pytest.raises(rubric.RubricError):
        rubric.parse_verdict(rubric.DEFAULT_RUBRIC, {"verdict": "reject"}, scores)
    verdict = rubric.parse_verdict(rubric.DEFAULT_RUBRIC, {"verdict": "approve", "send_back": "1"}, scores)
    assert verdict.send_back is False and verdict.scores == scores


@pytest.mark.django_db
def test_project_settings_are_validated_and_saved():
    with pytest.raises(rubric.RubricError) as bad:
        rubric.save_project_settings("p", rubric="[]", review_first_n="-1", review_share="2", gold_rate="x")
    assert len(bad.value.messages) == 3
    row = rubric.save_project_settings(
        "p",
        rubric='[{"key": "k", "label": "K", "min": 1, "max": 3}]',
        review_first_n="2",
        review_share="0.5",
        gold_rate="0",
    )
    assert ProjectSettings.objects.get(project="p").review_share == 0.5
    assert rubric.rubric_of(row) == [{"key": "k", "label": "K", "min": 1, "max": 3}]
    assert rubric.rubric_of(rubric.project_settings("other")) == rubric.DEFAULT_RUBRIC


@pytest.mark.django_db
def test_a_rejection_sends_the_task_back_to_the_pool(lead):
    task = TaskFactory(status=Task.Status.COMPLETED)
    trajectory = TrajectoryFactory(task=task, status=Trajectory.Status.SUBMITTED)
    Assignment.objects.create(task=task, annotator=trajectory.annotator, status=Assignment.Status.COMPLETED)
    active = ReviewAssignment.objects.create(trajectory=trajectory, reviewer=lead)
    verdict = rubric.Verdict("reject", {"task_completed": 1}, "Clicked the wrong cell.", "task_not_done", True)
    review = rubric.record_verdict(trajectory, lead, verdict)
    task.refresh_from_db(), active.refresh_from_db()
    assert trajectory.status == Trajectory.Status.REJECTED and task.status == Task.Status.PENDING
    assert active.status == ReviewAssignment.Status.DONE and review.scores == {"task_completed": 1}
    assert trajectory.metadata["rejection"] == {"review": review.pk, "reason": "task_not_done", "sent_back": True}
    # k = 2, one annotator still at work: one slot is open again; with k = 1 and a holder, it stays theirs.
    for k, reopened in ((2, True), (1, False)):
        other = TaskFactory(status=Task.Status.ASSIGNED, required_annotations=k)
        Assignment.objects.create(task=other, annotator=TrajectoryFactory().annotator)
        rejected = TrajectoryFactory(task=other, status=Trajectory.Status.SUBMITTED)
        rubric.record_verdict(rejected, lead, verdict)
        other.refresh_from_db()
        assert (other.status == Task.Status.PENDING) is reopened
        assert rejected.metadata["rejection"]["sent_back"] is reopened
    in_progress = TrajectoryFactory(status=Trajectory.Status.IN_PROGRESS)
    with pytest.raises(rubric.VerdictConflict):
        rubric.record_verdict(in_progress, lead, verdict)


@pytest.mark.django_db
def test_the_verdict_panel_saves_and_shows_errors(client, lead):
    trajectory = TrajectoryFactory(status=Trajectory.Status.SUBMITTED, task=TaskFactory(project="calc"))
    ProjectSettings.objects.create(project="calc", rubric=[{"key": "tidy", "label": "Tidy", "min": 1, "max": 3}])
    client.force_login(lead)
    url = reverse("lead-trajectory-verdict", args=[trajectory.pk])
    page = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert 'name="score-tidy"' in page and "score-efficient" not in page
    bad = client.post(url, {"verdict": "approve", "score-tidy": "9"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "out of range" in bad.content.decode()
    assert not Review.objects.exists()
    good = client.post(url, {"verdict": "approve", "score-tidy": "3", "comment": "fine"}, HTTP_HX_REQUEST="true")
    assert good.status_code == 200 and 'id="verdict-saved"' in good.content.decode()
    assert Review.objects.get().scores == {"tidy": 3}


@pytest.mark.django_db
def test_the_trajectory_page_review_form_uses_the_same_logic(client, lead):
    trajectory = TrajectoryFactory(status=Trajectory.Status.SUBMITTED)
    ReviewAssignment.objects.create(trajectory=trajectory, reviewer=lead)
    client.force_login(lead)
    url = reverse("trajectory-review", args=[trajectory.pk])
    assert client.post(url, {"verdict": "approve", "score-efficient": "0"}).status_code == 400
    assert client.post(url, {"verdict": "approve", "score": "4", "score-efficient": "5"}).status_code == 302
    review = Review.objects.get()
    assert (review.score, review.scores) == (4, {"efficient": 5})
    assert ReviewAssignment.objects.get().status == ReviewAssignment.Status.DONE
    assert "efficient 5" in client.get(reverse("trajectory", args=[trajectory.pk])).content.decode()


@pytest.mark.django_db
def test_the_projects_page_edits_rubric_and_sampling(client, lead):
    TaskFactory(project="calc")
    client.force_login(lead)
    page = client.get(reverse("lead-projects"), {"project": "calc"}).content.decode()
    assert "calc" in page and "thoughts_explain_actions" in page  # the default rubric, shown for editing
    url = reverse("lead-projects")
    fields = {"project": "calc", "review_first_n": "2", "review_share": "0.25", "gold_rate": "0.05"}
    bad = client.post(url, {**fields, "rubric": '[{"key": "tidy", "min": 3, "max": 1}]'}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "min (3) must be below max (1)" in bad.content.decode()
    assert 'id="project-errors"' in bad.content.decode() and not ProjectSettings.objects.exists()
    good = client.post(url, {**fields, "rubric": '[{"key": "tidy", "label": "Tidy", "min": 1, "max": 3}]'})
    assert good.status_code == 200 and 'id="project-saved"' in good.content.decode()
    row = ProjectSettings.objects.get(project="calc")
    assert (row.review_first_n, row.review_share, row.rubric[0]["key"]) == (2, 0.25, "tidy")


@pytest.mark.django_db
def test_the_verdict_api(lead_api, lead):
    trajectory = TrajectoryFactory(status=Trajectory.Status.SUBMITTED)
    url = reverse("review-verdict", args=[trajectory.pk])
    state = lead_api.get(url).json()
    assert [c["key"] for c in state["rubric"]] == [c["key"] for c in rubric.DEFAULT_RUBRIC]
    body = {"verdict": "reject", "scores": {"task_completed": 1, "efficient": 9, "thoughts_explain_actions": 2}}
    bad = lead_api.post(url, body, format="json")
    assert bad.status_code == 400 and len(bad.json()["errors"]) == 2  # out of range, and no reason
    body |= {"scores": {"task_completed": 1, "efficient": 2, "thoughts_explain_actions": 2}, "reason": "other"}
    made = lead_api.post(url, body | {"send_back": True, "comment": "See step 3."}, format="json")
    assert made.status_code == 201 and made.json()["scores"]["efficient"] == 2
    assert lead_api.get(url).json()["reviews"][0]["verdict"] == "reject"
    assert lead_api.post(url, {"verdict": "approve", "scores": {}, "extra": 1}, format="json").status_code == 400


@pytest.mark.django_db
def test_the_queue_api(lead_api, make_user):
    ProjectSettings.objects.create(project="", review_first_n=5, review_share=0.0)
    trajectory = TrajectoryFactory(status=Trajectory.Status.SUBMITTED, submitted_at=timezone.now())
    listed = lead_api.get(reverse("review-queue")).json()
    assert [(e["trajectory_id"], e["reason"]) for e in listed] == [(trajectory.pk, "new_annotator")]
    taken = lead_api.post(reverse("review-next"), {}, format="json")
    assert taken.status_code == 200 and taken.json()["trajectory"] == trajectory.pk
    other = api_client_for(make_user(Role.DATA_LEAD))
    empty = other.post(reverse("review-next"), {"flag": "near_duplicate"}, format="json")
    assert empty.status_code == 404 and "No trajectories" in empty.json()["detail"]
