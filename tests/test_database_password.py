"""The database password is each installation's own: scripts/env.sh makes it, scripts/services gives it to the role
(also to a role made earlier with the old public default), and production refuses the default or none."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from .servers import free_port

ROOT = Path(__file__).resolve().parent.parent
PUBLIC_DEFAULT = "annotation-local"


def _start_django(**env: str) -> subprocess.CompletedProcess:
    code = "import django; django.setup(); print('started')"
    environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "annotation_app.settings", **env}
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("password", "host", "refused"),
    [
        (PUBLIC_DEFAULT, "127.0.0.1", True),
        ("", "127.0.0.1", True),
        ("", "/var/run/postgresql", False),  # peer authentication on the unix socket needs none
        ("f00d" * 12, "127.0.0.1", False),
    ],
)
def test_production_refuses_the_public_or_an_empty_database_password(password, host, refused):
    result = _start_django(
        DJANGO_ENV="production", DJANGO_DEBUG="0", DJANGO_SECRET_KEY="k" * 50, DATABASE_PASSWORD=password, PGHOST=host
    )
    if refused:
        assert result.returncode != 0 and "Set DATABASE_PASSWORD to this installation's own" in result.stderr
    else:
        assert result.returncode == 0 and "started" in result.stdout, result.stderr


@pytest.fixture
def installation():
    """A second installation of the project's PostgreSQL and Redis: its own var/ and ports, stopped afterwards."""
    var = Path(tempfile.mkdtemp(prefix="annotation-var-", dir="/var/tmp"))
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DATABASE_", "REDIS", "PG"))  # what env.sh derives: made afresh for this one
    }
    env |= {"VAR_DIR": str(var), "PGPORT": str(free_port()), "REDIS_PORT": str(free_port())}
    yield var, env
    subprocess.run([str(ROOT / "scripts" / "services"), "stop"], env=env, capture_output=True, timeout=120)
    shutil.rmtree(var, ignore_errors=True)


def _connects(env: dict[str, str], password: str) -> bool:
    try:
        psycopg.connect(
            host="127.0.0.1", port=int(env["PGPORT"]), user="annotation", password=password, dbname="annotation"
        ).close()
    except psycopg.OperationalError as exc:
        assert "password authentication failed" in str(exc)
        return False
    return True


def test_an_installation_makes_its_own_database_password_and_an_old_role_takes_it(installation):
    var, env = installation
    services = [str(ROOT / "scripts" / "services"), "start"]
    # Made as before: the role got the public default.
    subprocess.run(services, env={**env, "DATABASE_PASSWORD": PUBLIC_DEFAULT}, check=True, capture_output=True)
    assert _connects(env, PUBLIC_DEFAULT)
    # Started again as now: a password of its own, private under var/, and the role takes it.
    subprocess.run(services, env=env, check=True, capture_output=True, timeout=120)
    secret = var / "database-password"
    password = secret.read_text().strip()
    assert len(password) >= 32 and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert _connects(env, password) and not _connects(env, PUBLIC_DEFAULT)
    # Once made, it stays: a third start changes nothing.
    subprocess.run(services, env=env, check=True, capture_output=True, timeout=120)
    assert secret.read_text().strip() == password and _connects(env, password)
