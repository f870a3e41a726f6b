"""Iterations on a real Celery worker (the `flywheel` queue): started over the API, run to the end; and a worker
killed with SIGKILL in the middle of validation, after which a new worker finishes it with nothing duplicated."""

from __future__ import annotations

import os
import random
import signal
import time

from django.urls import reverse

from flywheel.models import DatasetVersion, Iteration, Validation
from flywheel.tasks import run_iteration_task

from ..conftest import api_client_for, celery_worker
from .helpers import png, population


def _wait(pk: int, done: callable, timeout: float = 120) -> Iteration:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        iteration = Iteration.objects.get(pk=pk)
        if done(iteration):
            return iteration
        time.sleep(0.2)
    raise AssertionError(f"iteration {pk} stuck: {Iteration.objects.get(pk=pk).stages}")


def test_an_iteration_started_over_the_api_runs_on_the_worker(
    media, worker, make_user
):  # media first: the worker shares it
    pop = population(random.Random(21), 20, screenshots=png(640, 400), reviewer=make_user("data_lead"))
    engineer = make_user("ml_engineer")
    response = api_client_for(engineer).post(reverse("flywheel-iteration-list"), {}, format="json")
    assert response.status_code == 201, response.content
    iteration = _wait(response.json()["id"], lambda i: i.finished)
    assert iteration.status == Iteration.Status.SUCCEEDED, (iteration.error, worker.read_text()[-3000:])
    assert set(Validation.objects.filter(iteration=iteration).values_list("trajectory_id", flat=True)) == pop.in_scope
    made = {v.kind: v.added_count for v in DatasetVersion.objects.filter(iteration=iteration)}
    assert sum(made.values()) == Validation.objects.filter(iteration=iteration, route__in=["sft", "ct"]).count()
    detail = api_client_for(engineer).get(reverse("flywheel-iteration-detail", args=[iteration.pk])).json()
    assert detail["stages"]["validate"]["output"]["validated"] == len(pop.in_scope)
    assert detail["stages"]["export"]["status"] == "done"


def test_a_killed_worker_leaves_an_iteration_the_next_worker_finishes_once(transactional_db, tmp_path, make_user):
    from annotation_app.celery import app

    pop = population(random.Random(22), 1500, steps=(1, 3))
    engineer = make_user("ml_engineer")
    with celery_worker(tmp_path / "worker1.log", FLYWHEEL_CHUNK="20"):
        pid = next(iter(app.control.inspect(timeout=2).stats().values()))["pid"]
        response = api_client_for(engineer).post(
            reverse("flywheel-iteration-list"), {"stages": ["validate"]}, format="json"
        )
        pk = response.json()["id"]
        _wait(pk, lambda i: i.stages["validate"].get("done", 0) >= 100)
        os.kill(pid, signal.SIGKILL)
    killed = Iteration.objects.get(pk=pk)
    partial = Validation.objects.filter(iteration_id=pk).count()
    assert killed.status == Iteration.Status.RUNNING and 100 <= partial < len(pop.in_scope)
    with celery_worker(tmp_path / "worker2.log", FLYWHEEL_CHUNK="500"):
        run_iteration_task.delay(pk)  # what the redelivery (or `manage.py flywheel resume`) does
        iteration = _wait(pk, lambda i: i.finished)
    assert iteration.status == Iteration.Status.SUCCEEDED, iteration.error
    ids = list(Validation.objects.filter(iteration_id=pk).values_list("trajectory_id", flat=True))
    assert len(ids) == len(set(ids)) and set(ids) == pop.in_scope
    assert iteration.stages["validate"]["done"] == len(pop.in_scope)
