"""The data lead's agreement pages: tasks where annotators disagree with the per-pair table, the side-by-side
adjudication of one task, and a task's k / gold setting. Thin: the logic lives in agreement, adjudication, gold."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from . import adjudication, agreement, gold, task_queue
from .models import Task, User
from .permissions import Capability, requires


def _threshold(raw: str) -> float | None:
    """The page's agreement threshold, 0..1, or None when `raw` is not one."""
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None


@require_GET
@requires(Capability.REVIEW)
def agreement_page(request: HttpRequest) -> HttpResponse:
    """Tasks whose annotators disagree (agreement below the threshold or a split outcome), and every pair's table."""
    raw = request.GET.get("threshold", "").strip() or str(agreement.DEFAULT_THRESHOLD)
    threshold = _threshold(raw)
    error = "" if threshold is not None else f"'{raw}' is not a threshold: give a number from 0 to 1."
    results = agreement.cached_task_agreements()
    rows = agreement.disagreements(results, threshold if threshold is not None else agreement.DEFAULT_THRESHOLD)
    tasks = Task.objects.in_bulk([r["task_id"] for r in rows])
    names = dict(User.objects.filter(pk__in={a for r in rows for a in r["annotators"]}).values_list("pk", "username"))
    context = {
        "rows": [{**r, "task": tasks[r["task_id"]], "names": [names[a] for a in r["annotators"]]} for r in rows],
        "pairs": agreement.pair_agreement(results),
        "overlapping": len(results),
        "threshold": raw,
        "error": error,
    }
    return render(request, "agreement/agreement.html", context, status=400 if error else 200)


def _adjudicate_page(request: HttpRequest, task: Task, *, error: str = "", status: int = 200) -> HttpResponse:
    trajectories = adjudication.candidates(task)
    context = {
        "task": task,
        "trajectories": trajectories,
        "rows": adjudication.side_by_side(trajectories),
        "result": agreement.task_agreement(task.pk),
        "decision": adjudication.latest_decision(task),
        "error": error,
    }
    return render(request, "agreement/adjudicate.html", context, status=status)


@require_http_methods(["GET", "POST"])
@requires(Capability.REVIEW)
def adjudicate_page(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the task's annotations side by side; POST: the lead picks the one that stands (or neither)."""
    task = get_object_or_404(Task, pk=pk)
    if request.method == "GET":
        return _adjudicate_page(request, task)
    chosen = request.POST.get("chosen", "").strip()
    if not chosen:
        return _adjudicate_page(request, task, error="Pick the trajectory that stands, or neither.", status=400)
    try:
        adjudication.adjudicate(task, request.user, chosen, request.POST.get("note", ""))  # type: ignore[arg-type]
    except adjudication.AdjudicationRefused as exc:
        return _adjudicate_page(request, task, error=str(exc), status=400)
    return redirect("lead-adjudicate", pk=task.pk)


@require_POST
@requires(Capability.MANAGE_TASKS)
def task_overlap(request: HttpRequest, pk: int) -> HttpResponse:
    """A task's k (annotations wanted from different annotators) and gold flag; a refusal shows the task page (400)."""
    from .lead_views import _task_page

    task = get_object_or_404(Task, pk=pk)
    try:
        task_queue.set_overlap(
            task,
            required_annotations=request.POST.get("required_annotations", task.required_annotations),
            is_gold=request.POST.get("is_gold") == "on",
        )
    except gold.OverlapRefused as exc:
        return _task_page(request, task, error=str(exc), status=400)
    return redirect("lead-task", pk=task.pk)
