"""Putting work on the Celery queues by task name, so domain code never imports a task module (task modules import
the domain; the import graph stays a tree). The names are the tasks' registered names, which CELERY_TASK_ROUTES
routes by prefix (`annotation_app.live.*` to `live`, `annotation_app.asr.*` to `asr`)."""

from __future__ import annotations

import threading
from typing import Any

from celery import current_app

START_LIVE = "annotation_app.live.start"
PROPOSE_LIVE = "annotation_app.live.propose"
START_CAPTURE = "annotation_app.live.start_capture"
PROCESS_CAPTURE = "annotation_app.asr.process_capture"


_registry_lock = threading.Lock()


def registered(task_name: str) -> Any:
    """The Celery task registered as `task_name`. Web processes never run Celery's autodiscovery (workers do at
    start): the apps' task modules are imported on first use, under a lock, since two threads of a fresh web worker
    at once (gthread) found the registry half-filled and got NotRegistered (two simulated annotators opening
    sessions together)."""
    with _registry_lock:
        if task_name not in current_app.tasks:
            current_app.loader.import_default_modules()
        return current_app.tasks[task_name]


def enqueue(task_name: str, *args: Any) -> None:
    """Send the registered task `task_name` with `args` (`delay`, so eager mode and routing apply as usual)."""
    registered(task_name).delay(*args)
