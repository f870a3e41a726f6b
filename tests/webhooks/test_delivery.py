"""Deliveries through a real Celery worker to a real local HTTP receiver: signed bodies, retries with backoff, and
giving up after the last attempt, each recorded in the delivery log."""

from __future__ import annotations

import json
import time

import pytest
from django.urls import reverse

from annotation_app.models import Assignment, Trajectory
from annotation_app.webhooks import manage
from annotation_app.webhooks.models import Delivery, Event
from annotation_app.webhooks.signing import verify

from ..conftest import api_client_for, celery_worker
from ..factories import AssignmentFactory, StepFactory, TrajectoryFactory
from .receiver import receiver


@pytest.fixture(scope="module")
def module_worker(django_db_setup, tmp_path_factory):
    """One worker for the module, whose retries wait 0.2 s, 0.8 s, … and give up after 3 attempts."""
    log = tmp_path_factory.mktemp("webhooks") / "worker.log"
    with celery_worker(log, WEBHOOK_RETRY_BASE_S="0.2", WEBHOOK_MAX_ATTEMPTS="3"):
        yield log


@pytest.fixture
def fast_worker(transactional_db, module_worker):
    return module_worker


def _settled(delivery: Delivery, timeout: float = 60) -> Delivery:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        delivery.refresh_from_db()
        if delivery.status in (Delivery.Status.SUCCEEDED, Delivery.Status.FAILED):
            return delivery
        time.sleep(0.1)
    raise AssertionError(f"delivery still {delivery.status} after {timeout} s")


def test_a_submission_reaches_the_receiver_signed(fast_worker, make_user):
    annotator = make_user("annotator")
    assignment = AssignmentFactory(annotator=annotator)
    trajectory = TrajectoryFactory(task=assignment.task, annotator=annotator)
    StepFactory(trajectory=trajectory, index=0)
    with receiver() as hook_end:
        hook = manage.create(hook_end.url, [Event.TRAJECTORY_SUBMITTED, Event.TASK_COMPLETED], "", by=None)
        response = api_client_for(annotator).post(reverse("trajectory-submit", args=[trajectory.pk]))
        assert response.status_code == 200, response.content
        arrived = hook_end.wait_for(2)
    events = {}
    for sent_headers, body in arrived:
        assert verify(hook.secret, body, sent_headers["X-Webhook-Timestamp"], sent_headers["X-Webhook-Signature"])
        envelope = json.loads(body)
        assert envelope["id"] == sent_headers["X-Webhook-Delivery"]
        events[envelope["event"]] = envelope["data"]
    assert events["trajectory.submitted"]["trajectory"]["id"] == trajectory.pk
    assert events["trajectory.submitted"]["trajectory"]["status"] == Trajectory.Status.SUBMITTED
    assert events["task.completed"]["task"]["id"] == assignment.task_id
    assert Assignment.objects.get(pk=assignment.pk).status == Assignment.Status.COMPLETED
    logged = [_settled(d) for d in Delivery.objects.filter(webhook=hook)]
    assert {(d.status, d.attempts, d.response_status) for d in logged} == {(Delivery.Status.SUCCEEDED, 1, 200)}


def test_a_failing_receiver_gets_the_same_body_again_until_it_answers(fast_worker):
    with receiver(statuses=[500, 503]) as hook_end:
        hook = manage.create(hook_end.url, [Event.TRAJECTORY_SUBMITTED], "", by=None)
        delivery = manage.ping(hook, by=None)
        arrived = hook_end.wait_for(3)
    assert len({body for _, body in arrived}) == 1, "every attempt sends the same bytes"
    assert len({h["X-Webhook-Delivery"] for h, _ in arrived}) == 1
    delivery = _settled(delivery)
    assert (delivery.status, delivery.attempts, delivery.response_status) == (Delivery.Status.SUCCEEDED, 3, 200)
    assert delivery.error == ""


def test_it_gives_up_after_the_last_attempt_and_logs_why(fast_worker):
    with receiver(statuses=[503, 503, 503, 503]) as hook_end:
        hook = manage.create(hook_end.url, [Event.MODEL_PROMOTED], "", by=None)
        delivery = _settled(manage.ping(hook, by=None))
        assert len(hook_end.requests) == 3
    assert (delivery.status, delivery.attempts, delivery.response_status) == (Delivery.Status.FAILED, 3, 503)
    assert "503" in delivery.error and delivery.response_body == "receiver is down"


def test_an_unreachable_receiver_is_logged_not_raised(fast_worker):
    with receiver() as gone:
        url = gone.url  # the port is closed once the block ends
    hook = manage.create(url, [Event.MODEL_PROMOTED], "", by=None)
    delivery = _settled(manage.ping(hook, by=None))
    assert delivery.status == Delivery.Status.FAILED and delivery.response_status is None
    assert "Connect" in delivery.error
