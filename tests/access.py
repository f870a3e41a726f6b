"""The body every authorization matrix shares: reach a route as a role, and check the answer for that role."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from .conftest import api_client_for


def client_as(role: str, make_user: Any) -> Any:
    """An API client for `role`, logged in for pages too (the API accepts both); anonymous for "anonymous"."""
    if role == "anonymous":
        return api_client_for(None)
    user = make_user(role)
    client = api_client_for(user)
    client.force_login(user)
    return client


def reach(client: Any, method: str, url: str, kind: str) -> Any:
    """`method` on `url` with an empty body (JSON for the API)."""
    return getattr(client, method)(url, data={} if method != "get" else None, format="json" if kind == "api" else None)


def assert_answer(response: Any, role: str, allowed: set[str], kind: str, method: str, url: str) -> None:
    """Allowed roles get past the permission check; anonymous users get the login page (pages) or 401 (API);
    other roles 403 or 404. Never a 500."""
    code = response.status_code
    assert code != 500
    if role in allowed:
        assert code not in (401, 403), f"{role} should reach {method} {url}, got {code}"
        assert not (code == 302 and "/accounts/login/" in response.get("Location", ""))
    elif role == "anonymous":
        if kind == "page":
            assert code == 302 and response["Location"].startswith(reverse("login")), code
        else:
            assert code == 401, code
    else:
        assert code in (403, 404), f"{role} must not {method} {url}, got {code}"
