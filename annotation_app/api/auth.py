"""POST /api/auth/token/: DRF's token view, throttled so that passwords cannot be guessed at the API's speed."""

from __future__ import annotations

from typing import Any

from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.exceptions import Throttled
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle


class TokenAddressThrottle(SimpleRateThrottle):
    """All token requests from one client address (rate `auth_token_address`)."""

    scope = "auth_token_address"

    def get_cache_key(self, request: Request, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class TokenUserThrottle(SimpleRateThrottle):
    """Token requests for one username from one client address (rate `auth_token`)."""

    scope = "auth_token"

    def get_cache_key(self, request: Request, view: Any) -> str:
        data = request.data if isinstance(request.data, dict) else {}
        username = str(data.get("username", ""))[:150].lower()
        return self.cache_format % {"scope": self.scope, "ident": f"{self.get_ident(request)}:{username}"}


class ThrottledObtainAuthToken(ObtainAuthToken):
    """Username and password in, token out; too many tries answer 429 with how long to wait."""

    throttle_classes = [TokenUserThrottle, TokenAddressThrottle]

    def throttled(self, request: Request, wait: float | None) -> None:
        raise Throttled(wait, detail="Too many token requests for this account from your address.")


obtain_auth_token = ThrottledObtainAuthToken.as_view()
