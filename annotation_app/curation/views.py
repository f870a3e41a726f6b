"""The curation page (/lead/curation/): verification runs with live status, near-duplicate groups, flag counts, and
forms that start verifications (one trajectory or a batch) and a deduplication pass. Thin: logic in verify/dedup."""

from __future__ import annotations

import re

from django.db.models import Count, Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from annotation_app import queues
from annotation_app.models import Trajectory
from annotation_app.permissions import Capability, can, requires

from .dedup import DEDUP_TASK
from .flags import KINDS, LABELS
from .models import DuplicateGroup, TrajectorySignature, VerificationRun
from .verify import MAX_BATCH, Refused, start_verification

RUNS_SHOWN = 50
GROUPS_SHOWN = 30
_IDS = re.compile(r"[\s,;]+")


def flag_counts() -> list[tuple[str, str, int]]:
    """(kind, label, trajectories carrying it) for each curation flag kind."""
    counts = {kind: Trajectory.objects.filter(flags__contains=[{"kind": kind}]).order_by().count() for kind in KINDS}
    return [(kind, LABELS[kind], counts[kind]) for kind in KINDS]


def _runs_context() -> dict:
    runs = list(VerificationRun.objects.select_related("trajectory__task", "requested_by")[:RUNS_SHOWN])
    return {"runs": runs, "polling": any(r.active for r in runs)}


@require_GET
@requires(Capability.VIEW_TRAJECTORIES)
def curation(request: HttpRequest) -> HttpResponse:
    members = TrajectorySignature.objects.select_related("trajectory__annotator").order_by("trajectory_id")
    groups = (
        DuplicateGroup.objects.select_related("task")
        .prefetch_related(Prefetch("members", queryset=members))
        .annotate(size=Count("members"))[:GROUPS_SHOWN]
    )
    context = {**_runs_context(), "groups": groups, "counts": flag_counts(), "max_batch": MAX_BATCH,
               "can_start": can(request.user, Capability.REVIEW)}  # fmt: skip
    return render(request, "curation/page.html", context)


@require_GET
@requires(Capability.VIEW_TRAJECTORIES)
def runs(request: HttpRequest) -> HttpResponse:
    """htmx: the runs table, polled while a run is queued or running."""
    return render(request, "curation/_runs.html", _runs_context())


def parse_ids(text: str) -> list[int]:
    """Trajectory numbers separated by spaces, commas or semicolons; Refused names the first that is not one."""
    ids = []
    for part in _IDS.split(text.strip()):
        if not part:
            continue
        if not part.isdigit():
            raise Refused(f"'{part[:30]}' is not a trajectory number.")
        ids.append(int(part))
    if not ids:
        raise Refused("Give at least one trajectory number.")
    return ids


@require_POST
@requires(Capability.REVIEW)
def verify(request: HttpRequest) -> HttpResponse:
    """Queue verification runs for the trajectory numbers given; the result (and refusals) as a fragment."""
    try:
        started, problems = start_verification(parse_ids(request.POST.get("ids", "")), request.user)
    except Refused as exc:
        started, problems = [], [str(exc)]
    status = 400 if problems and not started else 200
    context = {"started": started, "problems": problems}
    return render(request, "curation/_started.html", context, status=status)


@require_POST
@requires(Capability.REVIEW)
def dedup(request: HttpRequest) -> HttpResponse:
    """Queue the incremental deduplication pass (unsigned trajectories) on the default queue."""
    queues.enqueue(DEDUP_TASK)
    return render(request, "curation/_started.html", {"dedup": True})
