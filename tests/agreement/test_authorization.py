"""Every agreement, adjudication and task-overlap route for every role: data leads (and superusers) only.
Annotators never see agreement scores, others' work or gold flags. tests/test_authorization.py takes
AGREEMENT_ROUTES as covered."""

from __future__ import annotations

import pytest
from django.urls import reverse

from annotation_app.models import Task, Trajectory

from ..access import assert_answer, client_as, reach
from ..conftest import ROLES, api_client_for
from ..factories import StepFactory, TaskFactory, TrajectoryFactory

A, L, M, S = "annotator", "data_lead", "ml_engineer", "superuser"
LEADS = {L, S}

# (url name, method, kind, roles allowed)
AGREEMENT_MATRIX: list[tuple[str, str, str, set[str]]] = [
    ("lead-agreement", "get", "page", LEADS),
    ("lead-adjudicate", "get", "page", LEADS),
    ("lead-adjudicate", "post", "page", LEADS),
    ("lead-task-overlap", "post", "page", LEADS),
]
AGREEMENT_ROUTES = {name for name, *_ in AGREEMENT_MATRIX}


@pytest.fixture
def task(db) -> Task:
    task = TaskFactory(required_annotations=2)
    for _ in range(2):
        StepFactory(trajectory=TrajectoryFactory(task=task, status=Trajectory.Status.SUBMITTED), index=0)
    return task


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("name", "method", "kind", "allowed"), AGREEMENT_MATRIX, ids=[f"{m} {n}" for n, m, *_ in AGREEMENT_MATRIX]
)
def test_authorization(role, name, method, kind, allowed, task, make_user):
    url = reverse(name) if name == "lead-agreement" else reverse(name, args=[task.pk])
    response = reach(client_as(role, make_user), method, url, kind)
    assert_answer(response, role, allowed, kind, method, url)


def test_annotators_never_see_gold_flags(make_user):
    """A gold task in an annotator's hands: neither the API nor their pages say it is gold."""
    from annotation_app import task_queue

    me = make_user(A)
    gold = TaskFactory(is_gold=True, evaluator={"func": "exact_match"}, instruction="Find the answer.")
    assignment = task_queue.next_task(me)
    assert assignment.task == gold
    client = api_client_for(me)
    client.force_login(me)
    bodies = [
        client.get(reverse("task-list")).content,
        client.get(reverse("task-detail", args=[gold.pk])).content,
        client.post(reverse("queue-next"), {}, format="json").content,
        client.get(reverse("annotate")).content,
    ]
    for body in bodies:
        assert b"Find the answer." in body or b"results" in body
        assert b"gold" not in body.lower(), body[:400]
