"""The few platform API calls the recorder makes besides uploading (who am I, my task queue, a task), with every
transport and HTTP failure turned into a ServerError or AuthError whose message says what to do."""

from __future__ import annotations

from typing import Any

import httpx

from .errors import AuthError, ServerError
from .version import RECORDER

TIMEOUT = httpx.Timeout(30.0, connect=10.0)


def detail(response: httpx.Response) -> str:
    """The API's error message ({"detail": ...}) or the start of the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200].strip() or response.reason_phrase
    if isinstance(body, dict) and body.get("detail"):
        return str(body["detail"])
    return str(body)[:200]


class ApiClient:
    def __init__(self, server: str, token: str, *, timeout: httpx.Timeout | float = TIMEOUT) -> None:
        self.server = server.rstrip("/")
        self.http = httpx.Client(
            base_url=self.server,
            headers={"Authorization": f"Token {token}", "User-Agent": RECORDER, "Accept": "application/json"},
            timeout=timeout,
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send one request; transport failures become ServerError (the server is not reachable)."""
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerError(f"cannot reach the server at {self.server}: {exc or type(exc).__name__}") from exc

    def call(self, method: str, path: str, *, ok: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        """The JSON answer of a request expected to succeed."""
        response = self.request(method, path, **kwargs)
        check(response, ok)
        try:
            return response.json()
        except ValueError as exc:
            raise ServerError(
                f"the server at {self.server} did not answer JSON for {path}", response.status_code
            ) from exc

    def me(self) -> dict[str, Any]:
        return self.call("GET", "/api/me/")

    def next_task(self, skip_current: bool = False) -> dict[str, Any] | None:
        """The annotator's current assignment, or the next one claimed from the queue; None when the queue is empty."""
        response = self.request("POST", "/api/queue/next/", json={"skip_current": skip_current})
        if response.status_code == 404:
            return None
        check(response, (200,))
        return response.json()

    def task(self, task_id: int) -> dict[str, Any]:
        return self.call("GET", f"/api/tasks/{task_id}/")


def check(response: httpx.Response, ok: tuple[int, ...]) -> None:
    if response.status_code in ok:
        return
    if response.status_code == 401:
        raise AuthError(
            f"the server rejected the token (401: {detail(response)}); "
            "log in again with `thinkaloud-recorder login --server URL --token KEY`",
            401,
        )
    if response.status_code == 403:
        raise AuthError(f"the server does not allow this account to do that (403: {detail(response)})", 403)
    raise ServerError(
        f"{response.request.method} {response.request.url.path} failed ({response.status_code}: {detail(response)})",
        response.status_code,
    )
