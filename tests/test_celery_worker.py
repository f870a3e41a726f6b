"""Celery through a real worker process on the real Redis broker, against the test database."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from annotation_app import tasks
from annotation_app.celery import app
from annotation_app.models import Assignment, Task

from .factories import AssignmentFactory


@pytest.mark.slow
def test_beat_task_runs_in_a_real_worker_on_every_queue(worker):
    for queue in settings.CELERY_QUEUES:
        stale = AssignmentFactory()
        Assignment.objects.filter(pk=stale.pk).update(assigned_at=timezone.now() - timedelta(days=3))
        result = tasks.release_stale_assignments.apply_async(queue=queue)
        assert result.get(timeout=60) == 1, f"queue {queue}"
        stale.refresh_from_db()
        assert stale.status == Assignment.Status.EXPIRED
        assert Task.objects.get(pk=stale.task_id).status == Task.Status.PENDING


# Every Celery task of the project and the queue of its workload: a new task must say here where it runs.
QUEUE_OF = {
    "annotation_app.asr.process_capture": "asr",
    "annotation_app.live.start": "live",
    "annotation_app.live.propose": "live",
    "annotation_app.live.start_capture": "live",
    "annotation_app.tasks.release_stale_assignments": "default",
    "flywheel.run_iteration": "flywheel",
    "flywheel.requeue_stalled": "flywheel",
    "training.flywheel_stage": "train",
    "sandbox.flywheel_stage": "sandbox",
    "sandbox.curation_verify": "sandbox",
    "annotation_app.curation.dedup": "default",
    "annotation_app.quality.refresh": "default",
    "annotation_app.webhooks.deliver": "default",
    "annotation_app.webhooks.resend_overdue": "default",
}


def registered_tasks() -> set[str]:
    """The project's task names as the worker registers them (Celery's own `celery.*` tasks left out)."""
    app.loader.import_default_modules()  # what a worker does at start: autodiscovery
    return {name for name in app.tasks if not name.startswith("celery.")}


def test_every_registered_task_is_routed_to_its_workloads_queue():
    assert registered_tasks() == set(QUEUE_OF)
    router = app.amqp.router
    assert {name: router.route({}, name)["queue"].name for name in QUEUE_OF} == QUEUE_OF
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost and app.conf.worker_prefetch_multiplier == 1
    assert {entry["task"] for entry in app.conf.beat_schedule.values()} <= registered_tasks()


def test_each_task_sent_without_a_queue_lands_in_its_workloads_queue():
    """As the code enqueues them (no queue given): the message is in the task's queue and no other."""
    app.control.purge()
    with app.connection_for_write() as conn:
        redis = conn.default_channel.client
        for name, queue in QUEUE_OF.items():
            app.send_task(name, args=[0])
            lengths = {q: redis.llen(q) for q in settings.CELERY_QUEUES}
            assert lengths == {q: int(q == queue) for q in settings.CELERY_QUEUES}, name
            redis.delete(queue)


def test_a_message_lands_in_its_own_queue_only():
    app.control.purge()
    with app.connection_for_write() as conn:
        redis = conn.default_channel.client
        for queue in settings.CELERY_QUEUES:
            tasks.release_stale_assignments.apply_async(queue=queue)
            lengths = {q: redis.llen(q) for q in settings.CELERY_QUEUES}
            assert lengths == {q: int(q == queue) for q in settings.CELERY_QUEUES}
            redis.delete(queue)
