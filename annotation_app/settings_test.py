"""Test settings: the real PostgreSQL and Redis, on Redis databases of their own and a throwaway media folder."""

import os
import tempfile
from pathlib import Path

os.environ.setdefault("REDIS_DB_CELERY", "14")
os.environ.setdefault("REDIS_DB_CHANNELS", "15")
os.environ.setdefault("REDIS_DB_CACHE", "13")

from .settings import *  # noqa: F403

# Server processes a test starts share the test process's folder (tests.servers.subprocess_env passes it on).
MEDIA_ROOT = Path(os.environ.get("TEST_MEDIA_ROOT") or tempfile.mkdtemp(prefix="annotation-test-media-"))
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed only; never outside tests
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405  (WhiteNoise warns about a missing folder)
