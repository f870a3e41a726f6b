"""The sandbox service: an HTTP/JSON API over the session manager, for the web app and the trainer.

Run it with `python -m sandbox.service` (settings from the environment, see `ServiceConfig`); the OpenAPI
documentation is at /docs. Callers authenticate with `Authorization: Bearer <SANDBOX_API_KEY>`; each session is
also bound to the `owner` that allocated it. Errors are JSON: {"error": <code>, "detail": <message>}.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import redis
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from .actions import ActionSyntaxError, action_to_dict, parse_actions
from .capture import CaptureConflict, Captures
from .desktop import DesktopError, UnsupportedAction
from .isolation import isolation_available
from .leases import LeaseExpired, LeaseNotFound, LeaseStore, NoCapacity, NotLeaseOwner
from .manager import RootInUse, Session, SessionLost, SessionManager
from .osworld import TaskConfigError, evaluate, run_setup
from .sdk import Files, PathOutsideSession, run_shell
from .vnc import mint_token, revoke_tokens

SETUP_SETTLE_CAP_S = 5.0  # a task's apps may take seconds to draw their first window
log = logging.getLogger(__name__)

ERRORS: list[tuple[type[Exception], int, str]] = [
    (NoCapacity, 503, "no_capacity"),
    (NotLeaseOwner, 403, "not_owner"),
    (LeaseNotFound, 404, "session_not_found"),
    (LeaseExpired, 410, "lease_expired"),
    (SessionLost, 410, "session_lost"),
    (DesktopError, 410, "session_lost"),
    (ActionSyntaxError, 400, "action_syntax"),
    (UnsupportedAction, 400, "unsupported_action"),
    (PathOutsideSession, 400, "path_outside_session"),
    (FileNotFoundError, 404, "file_not_found"),
    (NotADirectoryError, 400, "not_a_directory"),
    (TaskConfigError, 400, "task_config"),
    (CaptureConflict, 409, "capture_conflict"),
]


@dataclass(frozen=True)
class ServiceConfig:
    """Service settings, from SANDBOX_* environment variables."""

    api_key: str
    redis_url: str
    capacity: int
    warm: int
    sessions_root: Path
    namespace: str
    isolate: bool

    @classmethod
    def from_env(cls) -> ServiceConfig:
        key = os.environ.get("SANDBOX_API_KEY", "")
        if len(key) < 16:
            raise SystemExit("set SANDBOX_API_KEY (16+ characters): callers must present it")
        return cls(
            api_key=key,
            redis_url=os.environ.get("SANDBOX_REDIS_URL", "redis://127.0.0.1:63790/3"),
            capacity=int(os.environ.get("SANDBOX_CAPACITY", "8")),
            warm=int(os.environ.get("SANDBOX_WARM", "1")),
            sessions_root=Path(os.environ.get("SANDBOX_ROOT", "/var/tmp/sandbox-sessions")),
            namespace=os.environ.get("SANDBOX_NAMESPACE", "sandbox"),
            isolate=os.environ.get("SANDBOX_ISOLATE", "1" if isolation_available() else "0") == "1",
        )


class AllocateRequest(BaseModel):
    owner: str = Field(min_length=1, max_length=200, description="Who holds the session (e.g. user:42).")
    ttl_s: float = Field(default=300, gt=0, le=86400)
    kind: Literal["desktop", "browser"] = Field(default="desktop", description="A virtual desktop, or one browser.")


class SessionInfo(BaseModel):
    session_id: str
    owner: str
    kind: str
    screen_width: int
    screen_height: int
    model_width: int = Field(description="Width of the image the model sees; its coordinates refer to it.")
    model_height: int


class RenewRequest(BaseModel):
    owner: str
    ttl_s: float | None = Field(default=None, gt=0, le=86400)


class StepRequest(BaseModel):
    owner: str
    action_text: str = Field(description="UI-TARS action text, one or more actions separated by blank lines.")
    coordinates: Literal["model", "screen"] = "model"
    observe: bool = Field(default=True, description="Return a screenshot (JPEG, model size) taken after the step.")


class StepResponse(BaseModel):
    results: list[str]
    actions: list[dict]
    observation_jpeg_base64: str | None = None
    elapsed_ms: float
    settle: dict[str, Any] | None = Field(
        default=None, description="How long the observation waited for the screen to settle (waited_ms, timed_out)."
    )
    timings: dict[str, float] = Field(
        default_factory=dict,
        description="Where the step's time went, in ms: execute, settle, screenshot (grab, resize, JPEG), encode "
        "(base64), and cpu (this request's own CPU time in the service).",
    )


class VncTokenRequest(BaseModel):
    owner: str
    user: str = Field(min_length=1, max_length=200, description="The person who will watch, e.g. user:42.")
    ttl_s: float = Field(default=3600, gt=0, le=86400)


class VncTokenResponse(BaseModel):
    token: str = Field(description="Connect noVNC to ws(s)://<websockify>/?token=<token>; dies with the lease.")


class SetupRequest(BaseModel):
    owner: str
    config: list[dict] = Field(description="OSWorld `config`: [{type, parameters}].")


class EvaluateRequest(BaseModel):
    owner: str
    evaluator: dict = Field(description="OSWorld `evaluator`: {func, result, expected, conj}.")
    last_action: str | None = Field(
        default=None, description="The agent's last action (e.g. 'fail', 'finished'): infeasible tasks score by it."
    )


class VerifyRequest(BaseModel):
    owner: str
    script: str = Field(min_length=1, max_length=100_000, description="e.g. `window.score` or `() => document.title`")


class ShellRequest(BaseModel):
    owner: str
    command: str = Field(min_length=1, max_length=100_000)
    timeout_s: float = Field(default=30, gt=0, le=3600)


class ShellResponse(BaseModel):
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float


class CaptureStartRequest(BaseModel):
    owner: str
    instruction: str = Field(default="", max_length=10_000)
    task_id: int | None = None


class CaptureStartResponse(BaseModel):
    t: float = Field(description="The capture clock (seconds) when recording started answering: align audio to it.")


def create_app(manager: SessionManager, api_key: str, *, reclaim_every_s: float = 5.0) -> FastAPI:
    """The API over `manager`; a background thread reclaims dead or expired sessions and refills the warm pool.
    Starting claims the manager's root (reclaiming what a crashed run left); stopping releases every session."""
    stop = threading.Event()
    captures = Captures()

    def housekeeping() -> None:
        while not stop.wait(reclaim_every_s):
            try:
                for session_id, _ in manager.reclaim():
                    captures.discard(session_id)
                manager.fill_warm_pool()
            except Exception as exc:  # one failed round (a desktop that would not start) must not end them all
                # Ctrl-C reaches the whole process group, and a program being started is in it for an instant: when
                # the stop follows within a round, it caused the failure, which is then expected and no error.
                if stop.wait(reclaim_every_s):
                    log.info("housekeeping stopped mid-round: %s", exc)
                else:
                    log.error("housekeeping failed; trying again at the next round", exc_info=exc)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        await run_in_threadpool(manager.claim_root)
        await run_in_threadpool(manager.fill_warm_pool)
        worker = threading.Thread(target=housekeeping, name="sandbox-housekeeping", daemon=True)
        worker.start()
        yield
        stop.set()
        worker.join(timeout=30)  # a desktop it is starting takes up to its timeouts; shutdown() then drops it
        try:
            await run_in_threadpool(captures.close)
        except Exception:
            log.exception("closing the captures failed; the sessions are released anyway")
        await run_in_threadpool(manager.shutdown)

    app = FastAPI(title="Sandbox service", version="0.1.0", description=__doc__, lifespan=lifespan)

    def authorized(authorization: str = Header(default="")) -> None:
        if not secrets.compare_digest(authorization.encode(), f"Bearer {api_key}".encode()):
            raise _Unauthorized()

    for exc_type, status, code in ERRORS:
        app.add_exception_handler(exc_type, _handler(status, code))
    app.add_exception_handler(_Unauthorized, _handler(401, "unauthorized"))

    def info(session: Session) -> SessionInfo:
        width, height = session.mapping.model_size
        return SessionInfo(
            session_id=session.session_id, owner=session.owner, kind=session.kind, screen_width=session.screen.width,
            screen_height=session.screen.height, model_width=width, model_height=height,
        )  # fmt: skip

    auth = [Depends(authorized)]

    @app.post("/sessions", dependencies=auth, status_code=201)
    def allocate(body: AllocateRequest) -> SessionInfo:
        return info(manager.allocate(body.owner, body.ttl_s, body.kind))

    @app.post("/sessions/{session_id}/renew", dependencies=auth)
    def renew(session_id: str, body: RenewRequest) -> SessionInfo:
        manager.renew(session_id, body.owner, body.ttl_s)
        return info(manager.get(session_id, body.owner))

    @app.post("/sessions/{session_id}/reset", dependencies=auth)
    def reset(session_id: str, body: RenewRequest) -> SessionInfo:
        """A browser session back to a blank page, cookies and site storage cleared, its lease renewed: the next
        task's setup runs on it as on a new session, without starting another Chromium."""
        return info(manager.reset(session_id, body.owner, body.ttl_s))

    @app.delete("/sessions/{session_id}", dependencies=auth, status_code=204)
    def release(session_id: str, owner: str = Query()) -> Response:
        manager.get(session_id, owner)
        captures.discard(session_id)
        manager.release(session_id, owner)
        revoke_tokens(manager.leases, session_id)
        return Response(status_code=204)

    @app.post("/sessions/{session_id}/vnc-token", dependencies=auth, status_code=201)
    def vnc_token(session_id: str, body: VncTokenRequest) -> VncTokenResponse:
        session = manager.get(session_id, body.owner)
        if session.desktop is None:
            raise UnsupportedAction("VNC is for desktop sessions; watch a browser session through its screenshots")
        return VncTokenResponse(
            token=mint_token(manager.leases, session_id, body.owner, body.user, session.desktop.vnc_socket, body.ttl_s)
        )

    @app.post("/sessions/{session_id}/capture", dependencies=auth, status_code=201)
    def capture_start(session_id: str, body: CaptureStartRequest) -> CaptureStartResponse:
        """Record the desktop's input events and pre-action frames (think-aloud in the browser; no audio here)."""
        session = manager.get(session_id, body.owner)
        return CaptureStartResponse(t=captures.start(session, instruction=body.instruction, task_id=body.task_id))

    @app.post("/sessions/{session_id}/capture/stop", dependencies=auth, response_class=Response)
    def capture_stop(session_id: str, owner: str = Query()) -> Response:
        """Stop recording; the body is the capture archive (docs/in-situ.md) without audio."""
        manager.get(session_id, owner)
        archive, at = captures.stop(session_id)
        return Response(archive, media_type="application/x-tar", headers={"X-Capture-Stopped-At": f"{at:.3f}"})

    @app.post("/sessions/{session_id}/verify", dependencies=auth)
    def verify(session_id: str, body: VerifyRequest) -> dict[str, Any]:
        """Run a JavaScript verifier snippet in a browser session's page (a score, a level, a DOM value)."""
        session = manager.get(session_id, body.owner)
        if session.browser is None:
            raise UnsupportedAction("JavaScript verifiers run in browser sessions")
        with manager.driving(session):
            return {"value": session.browser.evaluate(body.script)}

    @app.post("/sessions/{session_id}/step", dependencies=auth)
    def step(session_id: str, body: StepRequest, response: Response) -> StepResponse:
        started, cpu = time.perf_counter(), time.thread_time()
        session = manager.get(session_id, body.owner)
        actions = parse_actions(body.action_text)
        mapping = session.mapping if body.coordinates == "model" else None
        observation = None
        settled = None
        clock = Stopwatch()
        with manager.driving(session) as screen:
            results = [screen.execute(action, mapping) for action in actions]
            clock.lap("execute")
            if body.observe:
                settled = screen.settle(since_action=True).as_dict()
                clock.lap("settle")
                jpeg = screen.screenshot(session.mapping.model_size)
                clock.lap("screenshot")
                observation = base64.b64encode(jpeg).decode()
                clock.lap("encode")
        timings = {**clock.laps, "cpu": (time.thread_time() - cpu) * 1000}
        response.headers["Server-Timing"] = ", ".join(f"{name};dur={ms:.1f}" for name, ms in timings.items())
        return StepResponse(
            results=results, actions=[action_to_dict(a) for a in actions], observation_jpeg_base64=observation,
            elapsed_ms=(time.perf_counter() - started) * 1000, settle=settled, timings=timings,
        )  # fmt: skip

    @app.get("/sessions/{session_id}/observation", dependencies=auth, response_class=Response)
    def observe(
        session_id: str,
        owner: str = Query(),
        fmt: Literal["jpeg", "png"] = "jpeg",
        size: Literal["model", "screen"] = "model",
    ) -> Response:
        session = manager.get(session_id, owner)
        dimensions = session.mapping.model_size if size == "model" else None
        with manager.driving(session) as screen:
            image = screen.screenshot(dimensions, fmt=fmt)
        return Response(image, media_type=f"image/{fmt}")

    @app.post("/sessions/{session_id}/setup", dependencies=auth)
    def setup(session_id: str, body: SetupRequest) -> dict[str, Any]:
        session = manager.get(session_id, body.owner)
        with manager.driving(session) as screen:
            screen.arm_settle()
            done = run_setup(session, body.config)
            settled = screen.settle(SETUP_SETTLE_CAP_S).as_dict()  # the first observation shows the set-up screen
        return {"done": done, "settle": settled}

    @app.post("/sessions/{session_id}/evaluate", dependencies=auth)
    def evaluate_task(session_id: str, body: EvaluateRequest) -> dict[str, float]:
        session = manager.get(session_id, body.owner)
        with manager.driving(session):
            return {"score": evaluate(session, body.evaluator, last_action=body.last_action)}

    @app.post("/sessions/{session_id}/shell", dependencies=auth)
    def shell(session_id: str, body: ShellRequest) -> ShellResponse:
        session = manager.get(session_id, body.owner)
        if session.user is None:
            raise UnsupportedAction("shell commands need isolated sessions (SANDBOX_ISOLATE=1, as root)")
        result = run_shell(session.user, body.command, timeout_s=body.timeout_s)
        return ShellResponse(**result.__dict__)

    @app.get("/sessions/{session_id}/files", dependencies=auth)
    def list_files(session_id: str, owner: str = Query(), path: str = ".") -> list[dict]:
        return _files(manager.get(session_id, owner)).list(path)

    @app.get("/sessions/{session_id}/files/content", dependencies=auth, response_class=Response)
    def read_file(session_id: str, owner: str = Query(), path: str = Query()) -> Response:
        return Response(_files(manager.get(session_id, owner)).read(path), media_type="application/octet-stream")

    @app.put("/sessions/{session_id}/files/content", dependencies=auth, status_code=204)
    async def write_file(session_id: str, request: Request, owner: str = Query(), path: str = Query()) -> Response:
        data = await request.body()
        files = _files(await run_in_threadpool(manager.get, session_id, owner))
        await run_in_threadpool(files.write, path, data)
        return Response(status_code=204)

    return app


class Stopwatch:
    """Wall time between laps, in ms, by the name of the part that just ended."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round((now - self.last) * 1000, 2)
        self.last = now


class _Unauthorized(Exception):
    def __str__(self) -> str:
        return "missing or wrong API key (Authorization: Bearer <SANDBOX_API_KEY>)"


def _handler(status: int, code: str):  # type: ignore[no-untyped-def]
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        detail = str(exc.args[0]) if exc.args else str(exc)
        return JSONResponse({"error": code, "detail": detail}, status_code=status)

    return handle


def _files(session: Session) -> Files:
    if session.user is None:
        raise UnsupportedAction("file functions need isolated sessions (SANDBOX_ISOLATE=1, as root)")
    return Files(session.user)


def build_app() -> FastAPI:
    """The app as configured by the environment (for `uvicorn --factory sandbox.service:build_app`)."""
    config = ServiceConfig.from_env()
    store = LeaseStore(redis.Redis.from_url(config.redis_url), capacity=config.capacity, namespace=config.namespace)
    manager = SessionManager(store, config.sessions_root, isolate=config.isolate, warm=config.warm)
    try:
        reclaimed = manager.claim_root()  # before serving: a crashed run's sessions are gone first
    except RootInUse as exc:
        raise SystemExit(str(exc)) from None
    if reclaimed:
        log.warning("reclaimed %d session(s) an earlier run left in %s", len(reclaimed), config.sessions_root)
    return create_app(manager, config.api_key)


KEEP_ALIVE_S = 75

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(
        "sandbox.service:build_app",
        factory=True,
        host=os.environ.get("SANDBOX_HOST", "127.0.0.1"),
        port=int(os.environ.get("SANDBOX_PORT", "8010")),
        workers=1,  # desktops are processes of the one manager that started them
        # Longer than its clients keep an idle connection (httpx: 5 s, uvicorn's default too): with equal timeouts a
        # client could send on a connection the service was closing that moment ("Server disconnected without sending
        # a response"), which failed an evaluation episode whose model thought for 5 s between two actions.
        timeout_keep_alive=KEEP_ALIVE_S,
    )
