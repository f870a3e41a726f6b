"""Leases on sandbox sessions, kept in Redis so that several service processes share them safely.

A lease says who holds a session until when. Every operation is one Lua script, so concurrent callers on any
number of processes see a consistent state, and time is Redis's own clock (no skew between hosts). Expired leases
stay counted out of capacity but in the store until `reclaim_expired` hands them to the manager, which then
cleans the session's processes: nothing is dropped silently.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import redis

# KEYS[1] = zset (session id -> expiry ms), KEYS[2] = hash prefix. Now = Redis TIME in ms.
_NOW = "local t = redis.call('TIME'); local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)"

_ACQUIRE = (
    _NOW
    + """
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
if live >= tonumber(ARGV[1]) then return {0, live} end
local expires = now + tonumber(ARGV[4])
redis.call('ZADD', KEYS[1], expires, ARGV[2])
redis.call('HSET', KEYS[2] .. ARGV[2], 'owner', ARGV[3], 'expires', expires, 'ttl_ms', ARGV[4], 'created', now)
return {1, expires}
"""
)

_RENEW = (
    _NOW
    + """
local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expires then return {0, 0} end
if tonumber(expires) <= now then return {-1, tonumber(expires)} end
if redis.call('HGET', KEYS[2] .. ARGV[1], 'owner') ~= ARGV[2] then return {-2, 0} end
local ttl = tonumber(ARGV[3])
if ttl <= 0 then ttl = tonumber(redis.call('HGET', KEYS[2] .. ARGV[1], 'ttl_ms')) end
local new_expiry = now + ttl
redis.call('ZADD', KEYS[1], 'XX', new_expiry, ARGV[1])
redis.call('HSET', KEYS[2] .. ARGV[1], 'expires', new_expiry)
return {1, new_expiry}
"""
)

_RELEASE = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
if redis.call('HGET', KEYS[2] .. ARGV[1], 'owner') ~= ARGV[2] then return -2 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2] .. ARGV[1])
return 1
"""

_RECLAIM = (
    _NOW
    + """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('DEL', KEYS[2] .. id)
end
return expired
"""
)


class LeaseError(Exception):
    """Base of the lease errors; each says which session and what happened."""


class NoCapacity(LeaseError):
    """Every session slot is leased; try again later."""


class LeaseNotFound(LeaseError):
    """No such lease: never granted, released, or reclaimed after it expired."""


class LeaseExpired(LeaseError):
    """The lease ran out before it was renewed; the session will be reclaimed."""


class NotLeaseOwner(LeaseError):
    """The lease belongs to someone else."""


@dataclass(frozen=True)
class Lease:
    session_id: str
    owner: str
    expires_ms: int  # Redis clock, milliseconds since the epoch


class LeaseStore:
    """Allocate, renew, release and reclaim leases on at most `capacity` sessions at once."""

    def __init__(self, client: redis.Redis, *, capacity: int, namespace: str = "sandbox") -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.client, self.capacity, self.namespace = client, capacity, namespace
        self.keys = [f"{namespace}:leases", f"{namespace}:lease:"]
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._reclaim = client.register_script(_RECLAIM)

    def acquire(self, owner: str, ttl_s: float, session_id: str | None = None) -> Lease:
        """Lease a session slot for `ttl_s` seconds; raises NoCapacity when all `capacity` slots are held."""
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        session_id = session_id or secrets.token_hex(12)
        ok, value = self._acquire(keys=self.keys, args=[self.capacity, session_id, owner, int(ttl_s * 1000)])
        if not ok:
            raise NoCapacity(f"no capacity: all {self.capacity} sessions are leased ({value} live)")
        return Lease(session_id, owner, int(value))

    def renew(self, session_id: str, owner: str, ttl_s: float | None = None) -> Lease:
        """Extend a live lease by `ttl_s` (default: its original TTL) from now."""
        ttl_ms = int(ttl_s * 1000) if ttl_s else 0
        status, value = self._renew(keys=self.keys, args=[session_id, owner, ttl_ms])
        if status == 1:
            return Lease(session_id, owner, int(value))
        raise self._error(status, session_id)

    def release(self, session_id: str, owner: str) -> None:
        status = self._release(keys=self.keys, args=[session_id, owner])
        if status != 1:
            raise self._error(status, session_id)

    def reclaim_expired(self, limit: int = 100) -> list[str]:
        """Remove up to `limit` expired leases and return their session ids, for the manager to clean up."""
        return [s.decode() if isinstance(s, bytes) else s for s in self._reclaim(keys=self.keys, args=[limit])]

    def live_count(self) -> int:
        now_s, now_us = self.client.time()
        return int(self.client.zcount(self.keys[0], f"({now_s * 1000 + now_us // 1000}", "+inf"))

    @staticmethod
    def _error(status: int, session_id: str) -> LeaseError:
        if status == -1:
            return LeaseExpired(f"the lease on session {session_id} expired before it was renewed")
        if status == -2:
            return NotLeaseOwner(f"session {session_id} is leased by someone else")
        return LeaseNotFound(f"no lease on session {session_id} (released, reclaimed or never granted)")
