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


def test_workloads_are_routed_to_their_own_queues():
    router = app.amqp.router
    assert router.route({}, "flywheel.tasks.score_trajectories")["queue"].name == "flywheel"
    assert router.route({}, "training.launch")["queue"].name == "train"
    assert router.route({}, "sandbox.reclaim_leases")["queue"].name == "sandbox"
    assert router.route({}, "annotation_app.asr.transcribe")["queue"].name == "asr"
    assert router.route({}, "annotation_app.tasks.release_stale_assignments")["queue"].name == "default"
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost and app.conf.worker_prefetch_multiplier == 1
    assert "release-stale-assignments" in app.conf.beat_schedule


def test_a_message_lands_in_its_own_queue_only():
    app.control.purge()
    with app.connection_for_write() as conn:
        redis = conn.default_channel.client
        for queue in settings.CELERY_QUEUES:
            tasks.release_stale_assignments.apply_async(queue=queue)
            lengths = {q: redis.llen(q) for q in settings.CELERY_QUEUES}
            assert lengths == {q: int(q == queue) for q in settings.CELERY_QUEUES}
            redis.delete(queue)
