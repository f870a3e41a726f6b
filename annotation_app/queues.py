"""Putting work on the Celery queues by task name, so domain code never imports a task module (task modules import
the domain; the import graph stays a tree). The names are the tasks' registered names, which CELERY_TASK_ROUTES
routes by prefix (`annotation_app.live.*` to `live`, `annotation_app.asr.*` to `asr`)."""

from __future__ import annotations

from typing import Any

from celery import current_app

START_LIVE = "annotation_app.live.start"
PROPOSE_LIVE = "annotation_app.live.propose"
START_CAPTURE = "annotation_app.live.start_capture"
PROCESS_CAPTURE = "annotation_app.asr.process_capture"


def enqueue(task_name: str, *args: Any) -> None:
    """Send the registered task `task_name` with `args` (`delay`, so eager mode and routing apply as usual)."""
    current_app.tasks[task_name].delay(*args)
