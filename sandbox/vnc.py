"""VNC to the browser: tokens for websockify, each bound to one lease and one user, dead when the lease ends.

websockify runs as one supervised process with `RedisLeaseTokens` as its token plugin (see `websockify_command`).
The browser connects to `ws://host:port/?token=<token>`; the plugin answers with the session's VNC unix socket
only while the token exists (its TTL) and the session's lease is live, so a released or expired lease refuses
the token at once. An Origin check (websockify's ExpectOrigin) keeps other sites' pages out.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import redis

from .leases import LeaseStore


def _token_key(namespace: str, token: str) -> str:
    return f"{namespace}:vnc:{token}"


def mint_token(store: LeaseStore, session_id: str, owner: str, user: str, vnc_socket: Path, ttl_s: float) -> str:
    """An unguessable token for `user` to watch `session_id` (leased by `owner`) for at most `ttl_s` seconds."""
    lease = store.client.hgetall(f"{store.keys[1]}{session_id}")
    if not lease or lease.get(b"owner", b"").decode() != owner:
        raise PermissionError(f"session {session_id} is not leased by {owner}")
    token = secrets.token_urlsafe(32)
    value = {"session_id": session_id, "user": user, "socket": str(vnc_socket)}
    store.client.set(_token_key(store.namespace, token), json.dumps(value), px=max(1, int(ttl_s * 1000)))
    return token


def revoke_tokens(store: LeaseStore, session_id: str) -> int:
    """Delete every token of a session (e.g. when it is released); returns how many."""
    removed = 0
    for key in store.client.scan_iter(f"{store.namespace}:vnc:*"):
        raw = store.client.get(key)
        if raw and json.loads(raw)["session_id"] == session_id:
            removed += store.client.delete(key)
    return removed


class RedisLeaseTokens:
    """websockify token plugin. Source: "<redis url> <namespace>", e.g. "redis://127.0.0.1:63790/3 sandbox"."""

    def __init__(self, src: str) -> None:
        url, _, namespace = src.partition(" ")
        self.client = redis.Redis.from_url(url)
        self.namespace = namespace.strip() or "sandbox"

    def lookup(self, token: str) -> tuple[str, str] | None:
        raw = self.client.get(_token_key(self.namespace, token))
        if raw is None:
            return None
        target = json.loads(raw)
        expires = self.client.zscore(f"{self.namespace}:leases", target["session_id"])
        now_s, now_us = self.client.time()
        if expires is None or expires <= now_s * 1000 + now_us // 1000:
            return None  # the lease ended: the token is dead even if it has not expired yet
        return "unix_socket", target["socket"]


def websockify_command(listen: str, redis_url: str, namespace: str, origins: list[str]) -> list[str]:
    """The supervised websockify process: token plugin above, Origin checked against `origins`."""
    return [
        sys.executable, "-m", "websockify", listen,
        "--token-plugin", "sandbox.vnc.RedisLeaseTokens", "--token-source", f"{redis_url} {namespace}",
        "--auth-plugin", "websockify.auth_plugins.ExpectOrigin", "--auth-source", " ".join(origins),
    ]  # fmt: skip
