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
    if task_name not in current_app.tasks:
        # Web processes never run Celery's autodiscovery (workers do at start): import the apps' task modules once.
        current_app.loader.import_default_modules()
    current_app.tasks[task_name].delay(*args)
