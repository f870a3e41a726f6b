"""API of a live interactive session: state, accept/override a step, live validation, retry proposals, end, VNC
token.

Only the trajectory's own annotator may use these (everyone else, superusers included, gets 404): the live page
drives them with its session cookie, scripts with a token.
"""

from __future__ import annotations

import base64
import time

from django.conf import settings
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from sandbox.actions import ActionSyntaxError

from .. import simulated, task_queue
from ..api import serializers as s
from ..models import LiveSession, Task
from ..permissions import Capability, allows, own_live_session
from ..trajectories import Conflict, Invalid
from . import sessions as live

STATE = inline_serializer("LiveState", {"status": serializers.CharField(), "next_index": serializers.IntegerField()})
ORACLE_STATE = inline_serializer(
    "OracleState",
    {
        "trajectory": serializers.IntegerField(), "next_index": serializers.IntegerField(),
        "family": serializers.CharField(), "metadata": serializers.DictField(), "state": serializers.DictField(),
        "screen_width": serializers.IntegerField(), "screen_height": serializers.IntegerField(),
        "model_width": serializers.IntegerField(), "model_height": serializers.IntegerField(),
    },
)  # fmt: skip
INLINE = OpenApiParameter(
    "observation", str, enum=["inline"], required=False,
    description="`inline`: the answer carries the new observation's JPEG as `observation_jpeg_base64`.",
)  # fmt: skip
VNC_TOKEN = inline_serializer("VncToken", {"token": serializers.CharField(), "port": serializers.CharField()})


class LiveView(APIView):
    permission_classes = [allows(Capability.ANNOTATE)]
    parser_classes = [JSONParser]

    def valid(self, serializer: type[serializers.Serializer], request: Request) -> dict:
        form = serializer(data=request.data or {})
        form.is_valid(raise_exception=True)
        return form.validated_data

    def live(self, request: Request, pk: int) -> LiveSession:
        session = own_live_session(request.user, pk)
        if session is None:
            raise Http404("No such live session.")
        return session


class LiveOpenSerializer(s.StrictSerializerMixin, serializers.Serializer):
    task = serializers.IntegerField(
        required=False, min_value=1, help_text="Simulated annotators only: the task to take (people use the queue)."
    )
    seed = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=2**31 - 1,
        help_text="Makes a new session's sampled proposals reproducible (each step's request is seeded from it).",
    )


class LiveOpenView(APIView):
    """Open (or resume) the caller's current task live; the desktop starts in the background (status "starting").
    A simulated annotator may name the task instead (annotation_app.simulated.claim)."""

    permission_classes = [allows(Capability.ANNOTATE)]

    @extend_schema(request=LiveOpenSerializer, responses={201: STATE})
    def post(self, request: Request) -> Response:
        form = LiveOpenSerializer(data=request.data if isinstance(request.data, dict) else {})
        form.is_valid(raise_exception=True)
        if "task" in form.validated_data:
            if not request.user.is_simulated:
                raise PermissionDenied("Only simulated annotators open a named task; take yours from the queue.")
            task = Task.objects.filter(pk=form.validated_data["task"]).first()
            if task is None:
                raise Http404("No such task.")
            assignment = simulated.claim(request.user, task)
        else:
            assignment = task_queue.current_assignment(request.user)
        if assignment is None:
            raise Conflict("You hold no task: take one from the queue first (POST /api/queue/next/).")
        session = live.open_live(request.user, assignment.task, seed=form.validated_data.get("seed"))
        return Response(live.state_of(session), status=status.HTTP_201_CREATED)


class LiveStateView(LiveView):
    @extend_schema(responses={200: STATE})
    def get(self, request: Request, pk: int) -> Response:
        return Response(live.state_of(self.live(request, pk)))


class LiveStepView(LiveView):
    """Accept a proposal or override it; the action runs in the sandbox before the answer comes back. With
    `?observation=inline` the answer also carries the new observation's JPEG (base64), the stored file's bytes, so
    the live page shows it without fetching it again."""

    @extend_schema(request=s.LiveStepSerializer, responses={201: STATE}, parameters=[INLINE])
    def post(self, request: Request, pk: int) -> Response:
        started, cpu = time.perf_counter(), time.thread_time()
        session = self.live(request, pk)
        data = self.valid(s.LiveStepSerializer, request)
        inline = request.query_params.get("observation", "") == "inline"
        timings: dict[str, float] = {}
        step, session = live.run_step(
            session,
            expected_index=data["expected_index"],
            candidate=data.get("candidate"),
            thought=data.get("thought", ""),
            action_text=data.get("action_text", ""),
            timings=timings,
        )
        body = {"step": live.step_json(step), "state": live.state_of(session)}
        if inline:
            body["observation_jpeg_base64"] = observation_base64(session)
        response = Response(body, status=status.HTTP_201_CREATED)
        timings["view"] = (time.perf_counter() - started) * 1000
        timings["cpu"] = (time.thread_time() - cpu) * 1000  # this request's own CPU time in the web worker
        response["Server-Timing"] = server_timing(timings)
        return response


def observation_base64(session: LiveSession) -> str | None:
    """The session's current observation as stored (base64 JPEG), or None when it has none."""
    if not session.observation:
        return None
    with session.observation.open("rb") as f:
        return base64.b64encode(f.read()).decode()


def server_timing(timings: dict[str, float]) -> str:
    """A Server-Timing header (W3C) of the step's parts, for the browser's Performance API and bench/live.py."""
    return ", ".join(f"{name};dur={ms:.1f}" for name, ms in timings.items())


class LiveValidateView(LiveView):
    """Check an action as the annotator types: the grammar and the screenshot bounds, with line and column."""

    @extend_schema(request=s.LiveValidateSerializer, responses={200: STATE})
    def post(self, request: Request, pk: int) -> Response:
        session = self.live(request, pk)
        text = self.valid(s.LiveValidateSerializer, request)["action_text"]
        try:
            checked = live.check_override("", text, session.model_width, session.model_height)
        except ActionSyntaxError as exc:
            error = {"message": exc.message, "line": exc.line, "column": exc.column}
            return Response({"valid": False, "errors": [error]})
        except Invalid as exc:
            return Response({"valid": False, "errors": [{"message": str(exc), "line": None, "column": None}]})
        return Response({"valid": True, "errors": [], "action_text": checked.action_text, "points": checked.points})


class LiveEndView(LiveView):
    """Abandon the session: the lease is released; the steps taken so far stay stored."""

    @extend_schema(request=s.LiveEndSerializer, responses={200: STATE})
    def post(self, request: Request, pk: int) -> Response:
        session = self.live(request, pk)
        reason = self.valid(s.LiveEndSerializer, request)["reason"]
        if not session.open:
            raise Conflict(f"This live session is already {session.get_status_display().lower()}.")
        return Response(live.state_of(live.end_live(session, reason)))


class LiveRetryView(LiveView):
    """Ask the model again for this step's proposals; `switch_to_active` first makes the active model the proposer."""

    @extend_schema(request=s.LiveRetrySerializer, responses={200: STATE})
    def post(self, request: Request, pk: int) -> Response:
        session = self.live(request, pk)
        switch = self.valid(s.LiveRetrySerializer, request).get("switch_to_active", False)
        return Response(live.state_of(live.retry_proposals(session, switch_to_active=switch)))


class LiveVncTokenView(LiveView):
    """A websockify token to watch this session's screen; it dies with the lease."""

    @extend_schema(request=None, responses={201: VNC_TOKEN})
    def post(self, request: Request, pk: int) -> Response:
        session = self.live(request, pk)
        if session.kind != "desktop":
            raise Conflict("A browser sandbox has no VNC screen: its live screen is the latest screenshot.")
        if session.status != LiveSession.Status.ACTIVE:
            raise Conflict("The session's desktop is not running.")
        client = live.sandbox_for(session.trajectory_id)
        try:
            token = client.vnc_token(session.sandbox_session_id, f"user:{request.user.pk}", settings.LIVE_LEASE_TTL_S)
        finally:
            client.close()
        return Response({"token": token, "port": settings.VNC_PUBLIC_PORT}, status=status.HTTP_201_CREATED)


class LiveOracleStateView(APIView):
    """The ground truth of a suite task's session for the oracle (annotation_app.simulated.oracle_state): only a
    simulated annotator's own session; 403 for every person (data leads included: it is the answer key), 404 for
    another simulated annotator's session, like the rest of the live API."""

    permission_classes = [allows(Capability.ANNOTATE)]

    @extend_schema(responses={200: ORACLE_STATE})
    def get(self, request: Request, pk: int) -> Response:
        if not request.user.is_simulated:
            raise PermissionDenied("Only simulated annotators may read a session's ground truth.")
        session = own_live_session(request.user, pk)
        if session is None:
            raise Http404("No such live session.")
        return Response(simulated.oracle_state(session))
