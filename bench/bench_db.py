"""A throwaway database for the benches that fill the schema with bulk data (flywheel_validation, quality): made
fresh and migrated, dropped afterwards, on the project's own PostgreSQL through its `postgres` database."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def admin_connection(env: dict[str, str]) -> Any:
    import psycopg

    return psycopg.connect(
        host=env.get("PGHOST", "127.0.0.1"),
        port=env["PGPORT"],
        user=env["DATABASE_USER"],
        password=env["DATABASE_PASSWORD"],
        dbname="postgres",
        autocommit=True,
    )


def create_database(env: dict[str, str], name: str) -> None:
    """`name` made anew (dropped first if it exists) and migrated."""
    with admin_connection(env) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')
        conn.execute(f'create database "{name}"')
    log(f"manage.py migrate ({name})")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)


def drop_database(env: dict[str, str], name: str) -> None:
    from django.db import connections

    connections.close_all()
    with admin_connection(env) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')
    log(f"dropped {name}")
