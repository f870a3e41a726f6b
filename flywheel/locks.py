"""PostgreSQL advisory locks: one running copy of an iteration, one writer of a store, across workers and hosts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


@contextmanager
def advisory_lock(key: str) -> Iterator[bool]:
    """A PostgreSQL session lock named `key`: yields False when another connection holds it. A killed worker's
    connection closes and its lock goes with it, so a redelivered task can take over."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [key])
        got = bool(cursor.fetchone()[0])
    try:
        yield got
    finally:
        if got:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [key])
