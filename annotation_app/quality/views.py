"""Quality dashboard pages for data leads and ML engineers: thin views over quality.dashboard."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST
from kombu.exceptions import OperationalError

from annotation_app.permissions import Capability, requires
from annotation_app.queues import enqueue

from . import aggregates, dashboard

REFRESH_TASK = "annotation_app.quality.refresh"
READ = Capability.VIEW_TRAJECTORIES  # data leads and ML engineers; annotators never see others' figures


@require_GET
@requires(READ)
def quality(request: HttpRequest) -> HttpResponse:
    """The dashboard; `?panel=status&after=<refresh id>` answers the refresh status (htmx polls it)."""
    if request.GET.get("panel") == "status":
        return _status(request)
    return render(request, "quality/dashboard.html", dashboard.context())


def _status(request: HttpRequest) -> HttpResponse:
    after = request.GET.get("after", "")
    if after and not after.isdigit():
        return HttpResponse("'after' takes a refresh number.", status=400, content_type="text/plain")
    latest = aggregates.latest()
    if latest is not None and latest.pk > int(after or 0):
        response = HttpResponse(status=204)
        response["HX-Refresh"] = "true"  # newer figures: htmx reloads the page
        return response
    return render(request, "quality/_status.html", {"queued": True, "after": after})


@require_POST
@requires(READ)
def refresh(request: HttpRequest) -> HttpResponse:
    """Queue a recomputation of the aggregates; the answer polls until the new figures are in, then reloads."""
    latest = aggregates.latest()
    try:
        enqueue(REFRESH_TASK, "button")
    except OperationalError:
        return HttpResponse(
            "The task queue did not answer: the figures were not refreshed. Try again later.",
            status=503,
            content_type="text/plain",
        )
    return render(request, "quality/_status.html", {"queued": True, "after": latest.pk if latest else 0})


@require_GET
@requires(READ)
def table_csv(request: HttpRequest, table: str) -> HttpResponse:
    """One dashboard table as a CSV download."""
    try:
        text = dashboard.table_csv(table)
    except dashboard.UnknownTable as exc:
        raise Http404(str(exc)) from None
    response = HttpResponse(text, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="quality-{table}.csv"'
    return response


@require_GET
@requires(READ)
def acceptance(request: HttpRequest) -> HttpResponse:
    """The per-model acceptance table alone, for the model registry page (loaded there by htmx)."""
    models = dashboard.acceptance_by_model(dashboard.acceptance_rows())
    return render(request, "quality/_acceptance.html", {"models": models, "refresh": aggregates.latest()})
