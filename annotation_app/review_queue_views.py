"""The data lead's review pages: the trajectory verdict panel (an htmx fragment), the review queue and the project
settings (rubric and sampling). Thin: the logic lives in annotation_app.rubric and annotation_app.review_queue."""

from __future__ import annotations

import json
from dataclasses import asdict
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from . import review_queue, rubric
from .models import ProjectSettings, Review, ReviewAssignment, Task, Trajectory
from .permissions import Capability, allows, requires


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


# --- the review queue ------------------------------------------------------------------------------------------


def queue_context(request: HttpRequest, **extra: object) -> dict:
    """The queue page's context: the reviewer's current review, the waiting trajectories and the flag filter."""
    flag = str(request.GET.get("flag", "") or request.POST.get("flag", "")).strip()[:60]
    current = review_queue.current_review(request.user)
    return {
        "current": current,
        "current_reason": review_queue.REASONS.get(current.reason, (0, current.reason))[1] if current else "",
        "entries": review_queue.pending_reviews(request.user, flag=flag, limit=100),
        "flag": flag,
        "flag_kinds": review_queue.flag_kinds_in_queue(),
        **extra,
    }


@require_GET
@requires(Capability.REVIEW)
def review_queue_page(request: HttpRequest) -> HttpResponse:
    """The review queue: the lead's current review (with the verdict panel) and what waits, in hand-out order."""
    return render(request, "review/queue.html", queue_context(request))


@require_POST
@requires(Capability.REVIEW)
def review_next(request: HttpRequest) -> HttpResponse:
    """Take the next trajectory to review (or keep the current one); htmx gets the current-review fragment."""
    flag = request.POST.get("flag", "").strip()[:60]
    message = ""
    try:
        review_queue.next_review(request.user, flag=flag)
    except review_queue.ReviewQueueEmpty as exc:
        message = str(exc)
    if request.htmx:
        return render(request, "review/queue_current.html", queue_context(request, empty_message=message))
    if message:
        messages.info(request, message)
    return redirect(reverse("lead-review-queue") + (f"?{urlencode({'flag': flag})}" if flag else ""))


@require_POST
@requires(Capability.REVIEW)
def review_release(request: HttpRequest) -> HttpResponse:
    """Give the current review back to the queue, for another reviewer."""
    if review_queue.release_review(request.user):
        messages.info(request, "The trajectory is back in the review queue.")
    return redirect("lead-review-queue")


# --- project settings: rubric and sampling ---------------------------------------------------------------------


def projects_context(project: str, **extra: object) -> dict:
    """The projects page: every project (from tasks and saved settings) and the form for `project`."""
    names = set(Task.objects.order_by().values_list("project", flat=True).distinct())
    saved = {row.project: row for row in ProjectSettings.objects.all()}
    names |= set(saved) | {""}
    rows = [(name, saved.get(name)) for name in sorted(names)]
    settings = rubric.project_settings(project)
    return {
        "rows": rows,
        "project": project,
        "settings": settings,
        "rubric_text": json.dumps(rubric.rubric_of(settings), indent=2),
        "default_rubric": not settings.rubric,
        **extra,
    }


@require_http_methods(["GET", "POST"])
@requires(Capability.REVIEW)
def projects(request: HttpRequest) -> HttpResponse:
    """Projects' review settings (GET, `?project=` picks the form) and saving one (POST; errors with 400)."""
    if request.method == "GET":
        return render(request, "review/projects.html", projects_context(request.GET.get("project", "")[:100]))
    project = request.POST.get("project", "").strip()
    fields = {key: request.POST.get(key, "") for key in ("rubric", "review_first_n", "review_share", "gold_rate")}
    template = "review/projects_form.html" if request.htmx else "review/projects.html"
    try:
        saved = rubric.save_project_settings(project, **fields)
    except rubric.RubricError as exc:
        context = projects_context(project[:100], errors=exc.messages, posted=fields)
        return render(request, template, context, status=400)
    return render(request, template, projects_context(saved.project, saved=True))


# --- API -------------------------------------------------------------------------------------------------------


class QueueEntrySerializer(serializers.Serializer):
    trajectory_id = serializers.IntegerField()
    task_id = serializers.IntegerField()
    annotator = serializers.CharField()
    instruction = serializers.CharField()
    submitted_at = serializers.DateTimeField(allow_null=True)
    rank = serializers.IntegerField(help_text="The annotator's n-th submitted trajectory.")
    flag_kinds = serializers.ListField(child=serializers.CharField())
    reason = serializers.CharField(help_text="new_annotator, low_agreement, flagged, resubmitted or sampled.")
    priority = serializers.IntegerField(help_text="Lower is handed out first.")


class ReviewAssignmentSerializer(serializers.ModelSerializer):
    reviewer = serializers.StringRelatedField()

    class Meta:
        model = ReviewAssignment
        fields = ["id", "trajectory", "reviewer", "status", "reason", "assigned_at", "finished_at"]


class NextReviewRequestSerializer(serializers.Serializer):
    flag = serializers.CharField(required=False, allow_blank=True, max_length=60, default="")


class CriterionSerializer(serializers.Serializer):
    key = serializers.CharField()
    label = serializers.CharField()
    min = serializers.IntegerField()
    max = serializers.IntegerField()


class VerdictRequestSerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(choices=Review.Verdict.choices)
    scores = serializers.DictField(child=serializers.IntegerField(), help_text="{criterion key: score}, every one.")
    comment = serializers.CharField(required=False, allow_blank=True, default="")
    reason = serializers.ChoiceField(choices=list(rubric.REJECT_REASONS), required=False, allow_blank=True)
    send_back = serializers.BooleanField(required=False, default=False)


class RubricReviewSerializer(serializers.ModelSerializer):
    reviewer = serializers.StringRelatedField()

    class Meta:
        model = Review
        fields = ["id", "reviewer", "verdict", "score", "scores", "comment", "created_at"]


class VerdictStateSerializer(serializers.Serializer):
    rubric = CriterionSerializer(many=True)
    reasons = serializers.DictField(child=serializers.CharField())
    reviews = RubricReviewSerializer(many=True)


class ReviewQueueView(APIView):
    """The review queue in hand-out order (GET ?flag=<curation flag kind> filters)."""

    permission_classes = [allows(Capability.REVIEW)]

    @extend_schema(
        parameters=[OpenApiParameter("flag", str, required=False)], responses={200: QueueEntrySerializer(many=True)}
    )
    def get(self, request: Request) -> Response:
        flag = str(request.query_params.get("flag", ""))[:60]
        entries = review_queue.pending_reviews(request.user, flag=flag, limit=100)
        return Response(QueueEntrySerializer([asdict(e) for e in entries], many=True).data)


class NextReviewView(APIView):
    """The reviewer's current review, or the next trajectory claimed for them (404 when the queue is empty)."""

    permission_classes = [allows(Capability.REVIEW)]
    parser_classes = [JSONParser]

    @extend_schema(request=NextReviewRequestSerializer, responses={200: ReviewAssignmentSerializer})
    def post(self, request: Request) -> Response:
        form = NextReviewRequestSerializer(data=request.data or {})
        form.is_valid(raise_exception=True)
        try:
            assignment = review_queue.next_review(request.user, flag=form.validated_data["flag"])
        except review_queue.ReviewQueueEmpty as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_404_NOT_FOUND)
        return Response(ReviewAssignmentSerializer(assignment).data)


class VerdictView(APIView):
    """A trajectory's rubric and reviews (GET), or record a rubric verdict on it (POST)."""

    permission_classes = [allows(Capability.REVIEW)]
    parser_classes = [JSONParser]

    def _trajectory(self, request: Request, pk: int) -> Trajectory:
        trajectory = get_object_or_404(Trajectory.objects.select_related("task"), pk=pk)
        if trajectory.annotator_id == request.user.pk:
            raise PermissionDenied("You may not review your own trajectory.")
        return trajectory

    @extend_schema(responses={200: VerdictStateSerializer})
    def get(self, request: Request, pk: int) -> Response:
        trajectory = self._trajectory(request, pk)
        state = {
            "rubric": rubric.rubric_for_trajectory(trajectory),
            "reasons": rubric.REJECT_REASONS,
            "reviews": trajectory.reviews.select_related("reviewer")[:50],
        }
        return Response(VerdictStateSerializer(state).data)

    @extend_schema(request=VerdictRequestSerializer, responses={201: RubricReviewSerializer})
    def post(self, request: Request, pk: int) -> Response:
        trajectory = self._trajectory(request, pk)
        form = VerdictRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = dict(form.validated_data)
        scores = data.pop("scores")
        try:
            verdict = rubric.parse_verdict(rubric.rubric_for_trajectory(trajectory), data, scores)
            review = rubric.record_verdict(trajectory, request.user, verdict)
        except rubric.RubricError as exc:
            return Response({"detail": str(exc), "errors": exc.messages}, status=status.HTTP_400_BAD_REQUEST)
        except rubric.VerdictConflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(RubricReviewSerializer(review).data, status=status.HTTP_201_CREATED)
