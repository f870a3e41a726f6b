"""Python client of the sandbox service (used by the web app and the trainer). Errors come back typed."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import httpx

from .outline import OUTLINE_JS, Element
from .outline import parse as parse_outline


class SandboxError(Exception):
    """An error answered by the service: `code` (e.g. "no_capacity"), HTTP `status` and its message."""

    def __init__(self, code: str, status: int, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code, self.status, self.detail = code, status, detail


class NoCapacityError(SandboxError):
    pass


class SessionGoneError(SandboxError):
    """The session was lost (its desktop died), its lease expired, or it does not exist."""


class ActionError(SandboxError):
    """The action text is not valid UI-TARS, or not an action of this environment."""


_TYPES = {
    "no_capacity": NoCapacityError,
    "session_lost": SessionGoneError,
    "lease_expired": SessionGoneError,
    "session_not_found": SessionGoneError,
    "action_syntax": ActionError,
    "unsupported_action": ActionError,
}


@dataclass(frozen=True)
class StepResult:
    results: list[str]
    actions: list[dict[str, Any]]
    observation_jpeg: bytes | None
    elapsed_ms: float
    settle: dict[str, Any] | None = None  # how long the observation waited for the screen (waited_ms, timed_out)


def connection(base_url: str, api_key: str, timeout_s: float = 120.0) -> httpx.Client:
    """An HTTP client for the service; thread-safe, keeps connections alive."""
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout_s)


class SandboxClient:
    """One caller (`owner`) of the service at `base_url`, authenticated with the service's API key."""

    def __init__(
        self, base_url: str, api_key: str, owner: str, *, timeout_s: float = 120.0, http: httpx.Client | None = None
    ) -> None:
        """`http`: a shared client made by `connection()`, so that callers acting for many owners reuse one
        connection pool (a new httpx.Client costs ~25 ms of TLS setup even for plain HTTP)."""
        self.owner = owner
        self.owns_http = http is None
        self.http = http if http is not None else connection(base_url, api_key, timeout_s)

    def close(self) -> None:
        if self.owns_http:
            self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SandboxError("unreachable", 503, f"the sandbox service did not answer: {exc}") from exc
        if response.status_code >= 400:
            try:
                body = response.json()
                code, detail = body.get("error", "http_error"), str(body.get("detail", body))
            except ValueError:
                code, detail = "http_error", response.text[:500]
            raise _TYPES.get(code, SandboxError)(code, response.status_code, detail)
        return response

    def allocate(self, ttl_s: float = 300, kind: str = "desktop") -> dict[str, Any]:
        """Lease a session: a virtual desktop, or (`kind="browser"`) one Chromium page."""
        return self._call("POST", "/sessions", json={"owner": self.owner, "ttl_s": ttl_s, "kind": kind}).json()

    def capture_start(self, session_id: str, *, instruction: str = "", task_id: int | None = None) -> float:
        """Start think-aloud capture on the session's desktop; the capture clock now (seconds)."""
        body = {"owner": self.owner, "instruction": instruction, "task_id": task_id}
        return float(self._call("POST", f"/sessions/{session_id}/capture", json=body).json()["t"])

    def capture_stop(self, session_id: str) -> bytes:
        """Stop the capture; its archive (no audio: the browser records that)."""
        return self._call("POST", f"/sessions/{session_id}/capture/stop", params={"owner": self.owner}).content

    def verify(self, session_id: str, script: str) -> Any:
        """Value of a JavaScript verifier snippet in a browser session's page."""
        return self._call(
            "POST", f"/sessions/{session_id}/verify", json={"owner": self.owner, "script": script}
        ).json()["value"]

    def outline(self, session_id: str) -> list[Element]:
        """A browser session's visible interactive elements (sandbox.outline: role, label, value, box in screen
        pixels), read by JavaScript in its page: an observation a model may be given beside the screenshot."""
        return parse_outline(self.verify(session_id, OUTLINE_JS))

    def renew(self, session_id: str, ttl_s: float | None = None) -> dict[str, Any]:
        return self._call("POST", f"/sessions/{session_id}/renew", json={"owner": self.owner, "ttl_s": ttl_s}).json()

    def reset(self, session_id: str, ttl_s: float | None = None) -> dict[str, Any]:
        """A browser session made fresh for another task (blank page, site data cleared) and its lease renewed."""
        return self._call("POST", f"/sessions/{session_id}/reset", json={"owner": self.owner, "ttl_s": ttl_s}).json()

    def release(self, session_id: str) -> None:
        self._call("DELETE", f"/sessions/{session_id}", params={"owner": self.owner})

    def vnc_token(self, session_id: str, user: str, ttl_s: float = 3600) -> str:
        """A websockify token for `user` to watch the session; it stops working when the lease ends."""
        body = {"owner": self.owner, "user": user, "ttl_s": ttl_s}
        return self._call("POST", f"/sessions/{session_id}/vnc-token", json=body).json()["token"]

    def step(
        self, session_id: str, action_text: str, *, coordinates: str = "model", observe: bool = True
    ) -> StepResult:
        body = {"owner": self.owner, "action_text": action_text, "coordinates": coordinates, "observe": observe}
        data = self._call("POST", f"/sessions/{session_id}/step", json=body).json()
        image = data.get("observation_jpeg_base64")
        return StepResult(
            data["results"], data["actions"], base64.b64decode(image) if image else None, data["elapsed_ms"],
            data.get("settle"),
        )  # fmt: skip

    def observe(self, session_id: str, *, fmt: str = "jpeg", size: str = "model") -> bytes:
        params = {"owner": self.owner, "fmt": fmt, "size": size}
        return self._call("GET", f"/sessions/{session_id}/observation", params=params).content

    def setup(self, session_id: str, config: list[dict[str, Any]]) -> list[str]:
        """Run an OSWorld task's `config` steps in the session."""
        return self.setup_settled(session_id, config)[0]

    def setup_settled(self, session_id: str, config: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any] | None]:
        """Run the task's `config` steps; what each did, and how long the service then waited for the screen to
        settle (sandbox.settle), so the first observation shows the set-up screen."""
        body = {"owner": self.owner, "config": config}
        data = self._call("POST", f"/sessions/{session_id}/setup", json=body).json()
        return data["done"], data.get("settle")

    def evaluate(self, session_id: str, evaluator: dict[str, Any], *, last_action: str | None = None) -> float:
        """Score the session against an OSWorld `evaluator`: 1.0 or 0.0; `last_action` (an action name) decides
        infeasible tasks (1 only for 'fail')."""
        body = {"owner": self.owner, "evaluator": evaluator, "last_action": last_action}
        return self._call("POST", f"/sessions/{session_id}/evaluate", json=body).json()["score"]

    def shell(self, session_id: str, command: str, timeout_s: float = 30) -> dict[str, Any]:
        body = {"owner": self.owner, "command": command, "timeout_s": timeout_s}
        return self._call("POST", f"/sessions/{session_id}/shell", json=body).json()

    def list_files(self, session_id: str, path: str = ".") -> list[dict[str, Any]]:
        return self._call("GET", f"/sessions/{session_id}/files", params={"owner": self.owner, "path": path}).json()

    def read_file(self, session_id: str, path: str) -> bytes:
        params = {"owner": self.owner, "path": path}
        return self._call("GET", f"/sessions/{session_id}/files/content", params=params).content

    def write_file(self, session_id: str, path: str, data: bytes) -> None:
        params = {"owner": self.owner, "path": path}
        self._call("PUT", f"/sessions/{session_id}/files/content", params=params, content=data)
