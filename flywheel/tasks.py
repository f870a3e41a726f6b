"""Celery tasks of the flywheel. CELERY_TASK_ROUTES routes by the name's prefix: `flywheel.*` to the `flywheel`
queue, `training.*` to `train` (GPU hosts), `sandbox.*` to `sandbox` (hosts near the sandbox service).

- `flywheel.run_iteration` runs the local stages (validation, export) and queues the next remote one;
- `training.flywheel_stage` / `sandbox.flywheel_stage` run one remote stage (training, evaluation / RFT) and queue
  `flywheel.run_iteration` again (flywheel/iterations.py: run_remote_stage);
- `flywheel.requeue_stalled` (beat, every FLYWHEEL_STALL_S / 2) queues again an iteration whose runner died.

All are `acks_late` with reject-on-worker-lost: a message whose worker died is delivered again (with Redis, once the
broker's visibility timeout has passed) — the stall beat usually gets there first; either way the rerun resumes:
stages done are skipped, advisory locks keep two runners off one stage. FLYWHEEL_CHUNK (environment) sets the
trajectories per round trip of validation."""

import os

from celery import shared_task
from django.conf import settings


@shared_task(name="flywheel.run_iteration", acks_late=True)
def run_iteration_task(iteration_id: int) -> str:
    """Run an iteration's local stages and queue its next remote one; returns its status."""
    from .iterations import CHUNK, run_iteration

    return run_iteration(iteration_id, chunk=int(os.environ.get("FLYWHEEL_CHUNK", CHUNK))).status


@shared_task(name="training.flywheel_stage", acks_late=True)
def train_stage_task(iteration_id: int, stage: str) -> str:
    """Run a training or evaluation stage of an iteration (the `train` queue), then let the iteration go on."""
    from .iterations import run_remote_stage

    return run_remote_stage(iteration_id, stage)


@shared_task(name="sandbox.flywheel_stage", acks_late=True)
def sandbox_stage_task(iteration_id: int, stage: str) -> str:
    """Run the RFT stage of an iteration (the `sandbox` queue), then let the iteration go on."""
    from .iterations import run_remote_stage

    return run_remote_stage(iteration_id, stage)


@shared_task(name="flywheel.requeue_stalled")
def requeue_stalled_task() -> list[int]:
    """Queue again the running iterations whose runner stopped beating (a killed worker)."""
    from .iterations import requeue_stalled

    return requeue_stalled(settings.FLYWHEEL_STALL_S)
