"""Every agreement, adjudication and task-overlap route for every role: data leads (and superusers) only.
Annotators never see agreement scores, others' work or gold flags. tests/test_authorization.py takes
AGREEMENT_ROUTES as covered."""

from __future__ import annotations

import pytest
from django.urls import reverse

from annotation_app.models import Task, Trajectory

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
    client = api_client_for(None)
    if role != "anonymous":
        user = make_user(role)
        client = api_client_for(user)
        client.force_login(user)
    url = reverse(name) if name == "lead-agreement" else reverse(name, args=[task.pk])
    response = getattr(client, method)(url, data={} if method != "get" else None)
    code = response.status_code
    assert code != 500
    if role in allowed:
        assert code not in (401, 403), f"{role} should reach {method} {url}, got {code}"
        assert not (code == 302 and "/accounts/login/" in response.get("Location", ""))
    elif role == "anonymous":
        assert code == 302 and response["Location"].startswith(reverse("login")), code
    else:
        assert code in (403, 404), f"{role} must not {method} {url}, got {code}"


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
