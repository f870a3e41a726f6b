"""Pages of in-situ think-aloud capture: the annotator's captures (and recorder token), and a capture's timeline."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST
from rest_framework.authtoken.models import Token

from .insitu import browser, pipeline, timeline
from .models import Capture
from .permissions import Capability, requires
from .trajectories import Conflict
from .upload_checks import UploadRejected


def _own(request: HttpRequest, pk: int) -> Capture:
    capture = Capture.objects.select_related("trajectory", "task").filter(pk=pk, annotator=request.user).first()
    if capture is None:
        raise Http404("No such capture.")
    return capture


@require_GET
@requires(Capability.ANNOTATE)
def captures(request: HttpRequest) -> HttpResponse:
    """The annotator's captures with their processing state, and how to connect the recorder."""
    return _captures_page(request)


def _captures_page(request: HttpRequest, error: str = "", status: int = 200) -> HttpResponse:
    """The Think-aloud page; a refused start is shown on it (`error`) with its HTTP status."""
    rows = Capture.objects.filter(annotator=request.user).select_related("task")[:100]
    rows = [browser.time_out_start(c) for c in rows]  # a desktop that never started fails, it is not polled forever
    context = {
        "captures": rows,
        "busy": any(c.pending for c in rows),
        "has_token": Token.objects.filter(user=request.user).exists(),
        "server": request.build_absolute_uri("/").rstrip("/"),
        "start_error": error,
    }
    if request.htmx:
        return render(request, "annotation_app/_captures_table.html", context)
    return render(request, "annotation_app/insitu.html", context, status=status)


@require_POST
@requires(Capability.ANNOTATE)
def recorder_token(request: HttpRequest) -> HttpResponse:
    """A new API token for the recorder (the old one stops working); shown once."""
    Token.objects.filter(user=request.user).delete()
    token = Token.objects.create(user=request.user)
    context = {"token": token.key, "server": request.build_absolute_uri("/").rstrip("/")}
    return render(request, "annotation_app/_recorder_token.html", context)


@require_GET
@requires(Capability.ANNOTATE)
def capture_page(request: HttpRequest, pk: int) -> HttpResponse:
    """The timeline: audio with the words highlighted as it plays, steps with screenshots and editable thoughts."""
    capture = browser.time_out_start(_own(request, pk))  # a desktop that never started fails here, not hangs
    recording = capture.trajectory.recordings.first() if capture.trajectory else None
    context = {
        "capture": capture,
        "data": timeline.timeline_json(capture) if capture.status in ("ready", "submitted") else None,
        "audio_url": recording.audio.url if recording and recording.audio else "",
        "editable": capture.status == Capture.Status.READY or timeline.fixable(capture),
        "fixing": timeline.fixable(capture),
        "reviews": capture.trajectory.reviews.select_related("reviewer") if capture.trajectory else [],
    }
    if request.htmx:
        # The status poll: once what the page waits for is over (processing, or the browser capture's desktop
        # starting, or that taking longer than CAPTURE_START_TIMEOUT_S), the whole page reloads to show the
        # timeline, the desktop ready to record, or the error.
        response = render(request, "annotation_app/_capture_status.html", context)
        if not capture.pending:
            response["HX-Refresh"] = "true"
        return response
    return render(request, "annotation_app/capture.html", context)


@require_POST
@requires(Capability.ANNOTATE)
def capture_retry(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        pipeline.requeue(_own(request, pk))
    except Conflict as exc:
        messages.error(request, str(exc))
    return redirect("insitu-capture-page", pk=pk)


@require_POST
@requires(Capability.ANNOTATE)
def capture_delete(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        timeline.delete_capture(_own(request, pk))
    except Conflict as exc:
        messages.error(request, str(exc))
        return redirect("insitu-capture-page", pk=pk)
    messages.info(request, "The capture and its files were deleted.")
    return redirect("insitu")


@require_POST
@requires(Capability.ANNOTATE)
def browser_start(request: HttpRequest) -> HttpResponse:
    """Record the current task in the browser: the capture page opens at once and shows "starting the desktop"
    while a Celery task leases a sandbox desktop and runs the task's setup. A capture of the task that is still
    starting or ready to record is resumed (a double submit leases one desktop, not two)."""
    try:
        capture = browser.open_browser_capture(request.user)
    except Conflict as exc:
        messages.error(request, str(exc))
        return redirect("insitu")
    except UploadRejected as exc:  # the capture quota is full: said on the page, with its status (413)
        return _captures_page(request, str(exc), status=exc.status)
    return redirect("insitu-capture-page", pk=capture.pk)
