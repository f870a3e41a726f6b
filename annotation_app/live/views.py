"""Pages of live interactive annotation: open the current task live, and the live page itself (owner only)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from sandbox.action_regex import HOTKEY_KEYS
from sandbox.actions import COMPUTER_ACTIONS, action_templates

from .. import task_queue
from ..context_processors import ws_url
from ..permissions import Capability, own_live_session, requires
from ..trajectories import Conflict
from . import sessions as live

# Snippets the override editor offers as the annotator types: the desktop actions of the grammar's own table.
ACTION_TEMPLATES = action_templates(COMPUTER_ACTIONS)


@require_POST
@requires(Capability.ANNOTATE)
def live_start(request: HttpRequest) -> HttpResponse:
    """Open (or resume) the annotator's current task live: a sandbox is leased and the model starts proposing."""
    assignment = task_queue.current_assignment(request.user)
    if assignment is None:
        messages.error(request, "Take a task from the queue first.")
        return redirect("annotate")
    try:
        session = live.open_live(request.user, assignment.task)
    except Conflict as exc:
        messages.error(request, str(exc))
        return redirect("annotate")
    return redirect("live", pk=session.trajectory_id)


@require_GET
@requires(Capability.ANNOTATE)
def live_page(request: HttpRequest, pk: int) -> HttpResponse:
    session = own_live_session(request.user, pk)
    if session is None:
        raise Http404("No such live session.")
    if session.open:
        live.lease_alive(session)
        session.refresh_from_db()
    trajectory = session.trajectory
    context = {
        "session": session,
        "trajectory": trajectory,
        "task": trajectory.task,
        "steps": trajectory.steps.order_by("index"),
        "state": live.state_of(session),
        "templates": ACTION_TEMPLATES,
        "hotkeys": HOTKEY_KEYS,
        "vnc_port": settings.VNC_PUBLIC_PORT,
        "greedy_first": settings.LIVE_GREEDY_FIRST and settings.LIVE_CANDIDATES > 1,
        "live_ws_url": ws_url(request, f"/ws/live/{trajectory.pk}/"),
    }
    return render(request, "annotation_app/live.html", context)
