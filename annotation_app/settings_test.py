"""Test settings: the real PostgreSQL and Redis, on Redis databases of their own and a throwaway media folder."""

import os
import tempfile
from pathlib import Path

os.environ.setdefault("REDIS_DB_CELERY", "14")
os.environ.setdefault("REDIS_DB_CHANNELS", "15")
os.environ.setdefault("REDIS_DB_CACHE", "13")

# scripts/test runs two pytest processes side by side: the second (TEST_WORKER=1) gets Redis databases and a sandbox
# namespace of its own, so its Celery broker (purged by tests), channel layer and cache are not the first one's (its
# test database has another name too). Applied once: the servers a test starts inherit the result.
_worker = os.environ.get("TEST_WORKER", "0")
if _worker != "0" and os.environ.get("TEST_ISOLATED_FOR") != _worker:
    _offset = 10 * int(_worker)
    for _name in ("REDIS_DB_CELERY", "REDIS_DB_CHANNELS", "REDIS_DB_CACHE"):
        os.environ[_name] = str(int(os.environ[_name]) + _offset)
    os.environ["SANDBOX_NAMESPACE"] = f"{os.environ.get('SANDBOX_NAMESPACE', 'sandbox')}-w{_worker}"
    os.environ["TEST_ISOLATED_FOR"] = _worker

from .settings import *  # noqa: E402, F403  (after the environment it reads)

# Server processes a test starts share the test process's folder (tests.servers.subprocess_env passes it on).
MEDIA_ROOT = Path(os.environ.get("TEST_MEDIA_ROOT") or tempfile.mkdtemp(prefix="annotation-test-media-"))
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed only; never outside tests
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405  (WhiteNoise warns about a missing folder)
