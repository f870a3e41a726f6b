"""The data lead's review pages: the trajectory verdict panel (an htmx fragment), the review queue and the project
settings (rubric and sampling). Thin: the logic lives in annotation_app.rubric and annotation_app.review_queue."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_http_methods

from . import rubric
from .models import Review, Trajectory
from .permissions import Capability, requires


def verdict_context(trajectory: Trajectory, **extra: object) -> dict:
    """What the verdict panel shows: the rubric, the reasons, the trajectory's reviews, and any error or result."""
    values = extra.get("values") or {}
    criteria = [c | {"value": values.get(f"score-{c['key']}", "")} for c in rubric.rubric_for_trajectory(trajectory)]
    return {
        "trajectory": trajectory,
        "rubric": criteria,
        "reasons": rubric.REJECT_REASONS.items(),
        "reviews": trajectory.reviews.select_related("reviewer")[:10],
        "reviewable": trajectory.status not in (Trajectory.Status.IN_PROGRESS, Trajectory.Status.ABANDONED),
        **extra,
        "values": values,
    }


@require_http_methods(["GET", "POST"])
@requires(Capability.REVIEW)
def trajectory_verdict(request: HttpRequest, pk: int) -> HttpResponse:
    """htmx fragment: the rubric verdict form of a trajectory (GET), or record a verdict (POST; errors with 400/409)."""
    trajectory = get_object_or_404(Trajectory.objects.select_related("task", "annotator"), pk=pk)
    if trajectory.annotator_id == request.user.pk:
        raise PermissionDenied("You may not review your own trajectory.")
    if request.method == "GET":
        return render(request, "review/verdict.html", verdict_context(trajectory))
    criteria = rubric.rubric_for_trajectory(trajectory)
    try:
        verdict = rubric.parse_verdict(criteria, request.POST, rubric.scores_from_form(request.POST))
        review = rubric.record_verdict(trajectory, request.user, verdict)
    except rubric.RubricError as exc:
        context = verdict_context(trajectory, errors=exc.messages, values=request.POST)
        return render(request, "review/verdict.html", context, status=400)
    except rubric.VerdictConflict as exc:
        return render(request, "review/verdict.html", verdict_context(trajectory, errors=[str(exc)]), status=409)
    saved = {"review": review, "sent_back": bool((trajectory.metadata.get("rejection") or {}).get("sent_back"))}
    if review.verdict != Review.Verdict.REJECT:
        saved["sent_back"] = False
    return render(request, "review/verdict.html", verdict_context(trajectory, saved=saved))
