"""Enqueueing by name works in a process that never imported a task module (a web worker): the tasks are found."""

import subprocess
import sys

from .servers import ROOT, subprocess_env


def test_a_fresh_process_enqueues_a_task_it_never_imported(transactional_db):
    code = (
        "import django; django.setup()\n"
        "from annotation_app.celery import app\n"
        "from annotation_app import queues\n"
        "app.conf.task_always_eager = True\n"
        "import sys; assert 'annotation_app.live.tasks' not in sys.modules\n"
        "queues.enqueue(queues.PROPOSE_LIVE, 0, 0)\n"  # no such live session: the task returns at once
        "print('sent')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "sent" in result.stdout, result.stderr[-2000:]
