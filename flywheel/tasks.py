"""Celery tasks of the flywheel, on the `flywheel` queue (CELERY_TASK_ROUTES sends `flywheel.*` there).

`acks_late` with reject-on-worker-lost: a message whose worker died is delivered again (with Redis, once the broker's
visibility timeout has passed), or the iteration is queued again by hand (`run_iteration_task.delay(id)`, or
`manage.py flywheel resume <id>`); either way the rerun resumes: stages done are skipped and validation continues
after the last trajectory it validated. FLYWHEEL_CHUNK (environment) sets the trajectories per round trip."""

import os

from celery import shared_task


@shared_task(name="flywheel.run_iteration", acks_late=True)
def run_iteration_task(iteration_id: int) -> str:
    """Run an iteration's remaining stages; returns its final status."""
    from .iterations import CHUNK, run_iteration

    return run_iteration(iteration_id, chunk=int(os.environ.get("FLYWHEEL_CHUNK", CHUNK))).status
