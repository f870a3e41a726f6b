"""Celery tasks of the flywheel, on the `flywheel` queue (CELERY_TASK_ROUTES sends `flywheel.*` there).

`acks_late` with reject-on-worker-lost: a worker killed mid-iteration leaves the message to be redelivered, and the
rerun resumes (stages done are skipped, validation continues after the last trajectory it validated)."""

from celery import shared_task


@shared_task(name="flywheel.run_iteration", acks_late=True)
def run_iteration_task(iteration_id: int) -> str:
    """Run an iteration's remaining stages; returns its final status."""
    from .iterations import run_iteration

    return run_iteration(iteration_id).status
