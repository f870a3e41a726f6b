"""Limits on guessing passwords: failed attempts counted in the shared cache (Redis), per client address and name.

The API's token view uses DRF's throttles (annotation_app.api.auth); the login page, a plain Django view, uses
`FailureLimiter`. Both take the client's address the same way (DRF's NUM_PROXIES decides whom to trust).
"""

from __future__ import annotations

import hashlib
import time

from django.core.cache import cache
from django.http import HttpRequest
from rest_framework.throttling import BaseThrottle


def client_address(request: HttpRequest) -> str:
    """The client's address: REMOTE_ADDR, or X-Forwarded-For as far as NUM_PROXIES trusts it."""
    return BaseThrottle().get_ident(request)


class FailureLimiter:
    """At most `allowed` failures per key in each fixed window of `window_s` seconds (atomic INCR in the cache)."""

    def __init__(self, scope: str, allowed: int, window_s: int) -> None:
        self.scope, self.allowed, self.window_s = scope, allowed, window_s

    def _key(self, key: str, now: float) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        return f"failures:{self.scope}:{digest}:{int(now // self.window_s)}"

    def wait_s(self, key: str) -> int:
        """Seconds until `key` may try again; 0 when it may now."""
        now = time.time()
        if (cache.get(self._key(key, now)) or 0) < self.allowed:
            return 0
        return int(self.window_s - now % self.window_s) + 1

    def failed(self, key: str) -> None:
        """Count one failure of `key` in the current window."""
        name = self._key(key, time.time())
        cache.add(name, 0, timeout=self.window_s + 1)
        try:
            cache.incr(name)
        except ValueError:  # expired between add and incr
            cache.add(name, 1, timeout=self.window_s + 1)
