"""The ML engineer's pages: flywheel overview (trajectory counts by mode and status) and the model registry."""

from __future__ import annotations

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from annotation_app.models import Trajectory
from annotation_app.permissions import Capability, can, requires

from .models import ModelVersion


@require_GET
@requires(Capability.VIEW_FLYWHEEL)
def overview(request: HttpRequest) -> HttpResponse:
    by_mode_status = Trajectory.objects.values_list("mode", "status").annotate(n=Count("id")).order_by()
    table = {mode: {status: 0 for status in Trajectory.Status.values} for mode in Trajectory.Mode.values}
    for mode, status, n in by_mode_status:
        table[mode][status] = n
    context = {
        "models": ModelVersion.objects.annotate(trajectory_count=Count("trajectories"))[:50],
        "table": [
            (Trajectory.Mode(mode).label, [row[s] for s in Trajectory.Status.values]) for mode, row in table.items()
        ],
        "statuses": Trajectory.Status.labels,
        "can_promote": can(request.user, Capability.MANAGE_MODELS),
    }
    return render(request, "flywheel/overview.html", context)


@require_POST
@requires(Capability.MANAGE_MODELS)
def promote(request: HttpRequest, pk: int) -> HttpResponse:
    get_object_or_404(ModelVersion, pk=pk).promote()
    return redirect("flywheel")
