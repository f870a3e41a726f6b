"""Two threads of a fresh web process sending their first Celery task at once (two simulated annotators opening
live sessions together on a new gunicorn worker) both find it registered."""

from __future__ import annotations

import subprocess
import sys

from ..servers import ROOT, subprocess_env

FIRST_USE = """
import threading, django
django.setup()
from annotation_app import queues
errors, barrier = [], threading.Barrier(4)
def look():
    barrier.wait()
    try:
        queues.registered(queues.START_LIVE)
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=look) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print("errors:", errors)
"""


def test_the_first_lookups_of_a_fresh_process_race_safely(db):
    for _ in range(2):  # it failed every time before the lock (4 of 4 runs with two threads)
        out = subprocess.run([sys.executable, "-c", FIRST_USE], cwd=ROOT, env=subprocess_env(), capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert out.stdout.strip() == "errors: []", out.stdout + out.stderr[-2000:]
