"""The data lead's pool pages beyond the landing page: live counts, every trajectory with filters, a task's page
with edit, archive and requeue. Thin: the changes live in task_pool."""

from __future__ import annotations

import json
from datetime import datetime

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from . import task_pool
from .curation.flags import KINDS as FLAG_KINDS
from .curation.flags import LABELS as FLAG_LABELS
from .models import Task, Trajectory, User
from .permissions import Capability, requires, trajectories_visible_to

TRAJECTORY_FILTERS = ("status", "mode", "annotator", "task", "q", "since", "until", "flag")


@require_GET
@requires(Capability.MANAGE_TASKS)
def lead_stats(request: HttpRequest) -> HttpResponse:
    """htmx: the pool's count boxes, refreshed by the page every few seconds and on every pool change."""
    return render(request, "annotation_app/_pool_stats.html", {"stats": task_pool.status_counts()})


def _date(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


@require_GET
@requires(Capability.VIEW_TRAJECTORIES)
def trajectories(request: HttpRequest) -> HttpResponse:
    """Every trajectory (reviewed, in progress and abandoned ones too), filtered and paged."""
    filters = {key: request.GET.get(key, "").strip() for key in TRAJECTORY_FILTERS}
    rows = trajectories_visible_to(request.user).select_related("task", "annotator").with_step_count()
    errors = []
    if filters["status"] in Trajectory.Status.values:
        rows = rows.filter(status=filters["status"])
    if filters["mode"] in Trajectory.Mode.values:
        rows = rows.filter(mode=filters["mode"])
    if filters["annotator"]:
        rows = rows.filter(annotator__username__iexact=filters["annotator"])
    if filters["task"]:
        if filters["task"].isdigit():
            rows = rows.filter(task_id=int(filters["task"]))
        else:
            errors.append("The task filter takes a task number.")
    if filters["q"]:
        rows = rows.filter(task__instruction__icontains=filters["q"])
    if filters["flag"]:  # curation flags (annotation_app.curation)
        if filters["flag"] in FLAG_KINDS:
            rows = rows.filter(flags__contains=[{"kind": filters["flag"]}])
        else:
            errors.append(f"'{filters['flag'][:40]}' is not a curation flag ({', '.join(FLAG_KINDS)}).")
    for key, lookup in (("since", "created_at__date__gte"), ("until", "created_at__date__lte")):
        if filters[key]:
            day = _date(filters[key])
            if day is None:
                errors.append(f"'{filters[key]}' is not a date (YYYY-MM-DD).")
            else:
                rows = rows.filter(**{lookup: day.date()})
    page = Paginator(rows.order_by("-created_at", "-id"), 50, allow_empty_first_page=True).get_page(
        request.GET.get("page")
    )
    context = {
        "page": page,
        "filters": filters,
        "errors": errors,
        "statuses": Trajectory.Status.choices,
        "modes": Trajectory.Mode.choices,
        "flag_kinds": [(kind, FLAG_LABELS[kind]) for kind in FLAG_KINDS],
        "annotators": User.objects.filter(trajectories__isnull=False).distinct().order_by("username"),
    }
    template = "annotation_app/_trajectory_table.html" if request.htmx else "annotation_app/trajectories.html"
    return render(request, template, context, status=400 if errors else 200)


@require_GET
@requires(Capability.MANAGE_TASKS)
def task_page(request: HttpRequest, pk: int) -> HttpResponse:
    return _task_page(request, get_object_or_404(Task, pk=pk))


def _task_page(request: HttpRequest, task: Task, *, error: str = "", status: int = 200) -> HttpResponse:
    context = {
        "task": task,
        "error": error,
        "setup_json": json.dumps(task.setup_config, indent=2),
        "evaluator_json": json.dumps(task.evaluator, indent=2) if task.evaluator else "",
        "metadata_json": json.dumps(task.metadata, indent=2) if task.metadata else "",
        "assignments": task.assignments.select_related("annotator").order_by("-assigned_at")[:50],
        "trajectories": task.trajectories.select_related("annotator").with_step_count().order_by("-created_at")[:50],
    }
    return render(request, "annotation_app/task.html", context, status=status)


@require_POST
@requires(Capability.MANAGE_TASKS)
def task_change(request: HttpRequest, pk: int) -> HttpResponse:
    """Edit, archive or requeue; a refused change shows the page again with the reason (400)."""
    task = get_object_or_404(Task, pk=pk)
    action = request.POST.get("action", "")
    try:
        if action == "edit":
            task_pool.edit_task(task, {k: request.POST[k] for k in task_pool.EDITABLE if k in request.POST})
        elif action == "archive":
            task_pool.archive_task(task)
        elif action == "requeue":
            task_pool.requeue_task(task)
        else:
            raise task_pool.TaskChangeRefused(f"Unknown action '{action}': edit, archive or requeue.")
    except task_pool.TaskChangeRefused as exc:
        task.refresh_from_db()
        return _task_page(request, task, error=str(exc), status=400)
    return redirect("lead-task", pk=task.pk)
