"""Browser pages: role landing pages and their htmx fragments. Logic lives in task_queue, task_import, trajectories."""

from __future__ import annotations

import mimetypes
from pathlib import PurePosixPath

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.paginator import Paginator
from django.db import connection, transaction
from django.db.models import Prefetch, Q
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from . import ranges, rubric, task_pool, task_queue, trajectories
from .live import sessions as live
from .models import Capture, Review, Role, Task, Trajectory
from .permissions import Capability, can, requires, trajectories_visible_to
from .task_import import TaskImportError, import_tasks
from .throttling import FailureLimiter, client_address
from .trajectories import Conflict
from .upload_checks import UploadRejected, check_size

LANDING = {Role.ANNOTATOR: "annotate", Role.DATA_LEAD: "lead", Role.ML_ENGINEER: "flywheel"}


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return redirect("login")
    if request.user.is_superuser:
        return redirect("lead")
    return redirect(LANDING.get(request.user.role, "login"))


class LoginView(auth_views.LoginView):
    """Django's login page, refusing with 429 once an address has failed too often for a username (or at all)."""

    def post(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        keys = self._keys(request)
        wait = max(limiter.wait_s(key) for limiter, key in keys)
        if wait:  # refused before the password is even checked
            minutes = -(-wait // 60)
            message = f"Too many failed log-ins from your address; try again in {minutes} minute{'s' * (minutes > 1)}."
            context = self.get_context_data(form=self.get_form_class()(request), throttled=message)
            return self.render_to_response(context, status=429)
        response = super().post(request, *args, **kwargs)
        if response.status_code == 200:  # the form came back: wrong username or password
            for limiter, key in keys:
                limiter.failed(key)
        return response

    @staticmethod
    def _keys(request: HttpRequest) -> list[tuple[FailureLimiter, str]]:
        address = client_address(request)
        username = request.POST.get("username", "")[:150].lower()
        allowed, window = settings.LOGIN_FAILURES_ALLOWED, settings.LOGIN_FAILURE_WINDOW_S
        return [
            (FailureLimiter("login", allowed, window), f"{address}:{username}"),
            (FailureLimiter("login-address", 10 * allowed, window), address),
        ]


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers and scripts: the database answers."""
    with connection.cursor() as cursor:
        cursor.execute("select 1")
    return JsonResponse({"status": "ok"})


# --- annotator -------------------------------------------------------------------------------------------------


@require_GET
@requires(Capability.ANNOTATE)
def annotate(request: HttpRequest) -> HttpResponse:
    context = {
        "assignment": task_queue.current_assignment(request.user),
        "trajectories": Trajectory.objects.filter(annotator=request.user)
        .select_related("task", "live")
        .only("id", "mode", "status", "created_at", "task__id", "task__instruction", "live__status")
        .with_step_count()
        .prefetch_related(Prefetch("reviews", Review.objects.order_by("-created_at"), to_attr="latest_reviews"))[:20],
        "skipped": task_queue.skipped_pending(request.user),
        "done_count": request.user.assignments.filter(status="completed").count(),
    }
    return render(request, "annotation_app/annotate.html", context)


@require_POST
@requires(Capability.ANNOTATE)
def annotate_next(request: HttpRequest) -> HttpResponse:
    """htmx: take the next task (or skip the current one); answers the 'current task' fragment."""
    error, skipped = "", 0
    try:
        assignment = live.next_task(request.user, skip_current=request.POST.get("skip") == "1")
    except task_queue.QueueEmpty as exc:
        assignment, error, skipped = None, str(exc), exc.skipped
    if not request.htmx:
        return redirect("annotate")
    context = {"assignment": assignment, "error": error, "skipped": skipped}
    return render(request, "annotation_app/_current_task.html", context)


@require_POST
@requires(Capability.ANNOTATE)
def annotate_unskip(request: HttpRequest) -> HttpResponse:
    """htmx: withdraw the annotator's skips, then hand them the next task as 'Get next task' does."""
    task_queue.unskip(request.user)
    return annotate_next(request)


# --- data lead -------------------------------------------------------------------------------------------------


@require_GET
@requires(Capability.MANAGE_TASKS)
def lead(request: HttpRequest) -> HttpResponse:
    tasks = Task.objects.order_by("-importance", "id")
    status, domain, query = (request.GET.get(k, "").strip() for k in ("status", "domain", "q"))
    if status in Task.Status.values:
        tasks = tasks.filter(status=status)
    if domain:
        tasks = tasks.filter(domain__icontains=domain)
    if query:
        tasks = tasks.filter(Q(instruction__icontains=query) | Q(external_id=query))
    page = Paginator(
        tasks.only("id", "instruction", "domain", "platform", "difficulty", "importance", "status"),
        50,
        allow_empty_first_page=True,
    ).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "filters": {"status": status, "domain": domain, "q": query},
        "statuses": Task.Status.choices,
        "stats": task_pool.status_counts(),
        "to_review": Trajectory.objects.filter(status=Trajectory.Status.SUBMITTED)
        .select_related("task", "annotator")
        .order_by("submitted_at")[:20],
    }
    template = "annotation_app/_task_table.html" if request.htmx else "annotation_app/lead.html"
    return render(request, template, context)


@require_POST
@requires(Capability.MANAGE_TASKS)
def lead_import(request: HttpRequest) -> HttpResponse:
    """htmx: import an uploaded JSON/JSONL task file; answers a result fragment (created count or the errors)."""
    upload = request.FILES.get("file")
    context: dict = {}
    status = 200
    if upload is None:
        context["message"], status = "Choose a JSON or JSON Lines file to import.", 400
    else:
        try:
            check_size(upload, what="The file", max_bytes=settings.MAX_TASK_IMPORT_BYTES)
            on_conflict = "skip" if request.POST.get("skip_existing") else "error"
            context["result"] = import_tasks(
                upload.read(), upload.name, created_by=request.user, on_conflict=on_conflict
            )
        except UploadRejected as exc:
            context["message"], status = str(exc), exc.status
        except TaskImportError as exc:
            context["errors"], context["total_errors"], status = exc.errors, exc.total_errors, 400
    return render(request, "annotation_app/_import_result.html", context, status=status)


# --- trajectories ----------------------------------------------------------------------------------------------


@require_GET
@requires(Capability.VIEW_TASKS)
def trajectory_detail(request: HttpRequest, pk: int) -> HttpResponse:
    trajectory = get_object_or_404(
        trajectories_visible_to(request.user).select_related("task", "annotator", "model_version"), pk=pk
    )
    return _trajectory_page(request, trajectory)


def _trajectory_page(
    request: HttpRequest, trajectory: Trajectory, review_error: str = "", status: int = 200, fix: str = ""
) -> HttpResponse:
    """The trajectory's page; a review or a fix that failed is shown on it (with its status), next to its form."""
    context = {
        "trajectory": trajectory,
        "steps": trajectory.steps.all(),
        "reviews": trajectory.reviews.select_related("reviewer"),
        "can_review": can(request.user, Capability.REVIEW) and trajectory.status != Trajectory.Status.IN_PROGRESS,
        "verdicts": Review.Verdict.choices,
        "review_error": review_error,
        **_fix_context(request, trajectory, fix),
    }
    return render(request, "annotation_app/trajectory.html", context, status=status)


def _fix_context(request: HttpRequest, trajectory: Trajectory, fix_error: str = "") -> dict:
    """What the page offers the annotator of a rejected trajectory: fix its thoughts (on the page for a live one, on
    the capture's timeline for an in-situ one) and resubmit, or attempt the task again."""
    own = can(request.user, Capability.ANNOTATE) and trajectory.annotator_id == request.user.pk
    can_fix = own and trajectory.status == Trajectory.Status.REJECTED
    capture = Capture.objects.filter(trajectory=trajectory).only("id").first() if can_fix else None
    before = trajectory.metadata.get("thoughts_before_fix", {}) if isinstance(trajectory.metadata, dict) else {}
    return {"can_fix": can_fix, "fix_capture": capture, "fix_error": fix_error, "thoughts_before_fix": before}


def _own_trajectory(request: HttpRequest, pk: int) -> Trajectory:
    """The annotator's own trajectory (404 for anyone else's: they may not know it exists)."""
    return get_object_or_404(
        Trajectory.objects.filter(annotator=request.user).select_related("task", "annotator", "model_version"), pk=pk
    )


@require_POST
@requires(Capability.ANNOTATE)
def trajectory_fix(request: HttpRequest, pk: int) -> HttpResponse:
    """Save the thoughts of the annotator's rejected trajectory (fields `thought-<index>`); with `resubmit`, send it
    back to review. A refusal is shown on the page with its status (400 or 409)."""
    trajectory = _own_trajectory(request, pk)
    thoughts = {
        int(key.removeprefix("thought-")): value
        for key, value in request.POST.items()
        if key.startswith("thought-") and key.removeprefix("thought-").isdigit()
    }
    try:
        with transaction.atomic():
            changed = trajectories.fix_thoughts(trajectory, request.user, thoughts)
            if request.POST.get("resubmit"):
                trajectories.resubmit(trajectory, request.user)
    except (Conflict, trajectories.Invalid) as exc:
        return _trajectory_page(request, trajectory, status=409 if isinstance(exc, Conflict) else 400, fix=str(exc))
    saved = f"{len(changed)} thought{'s' * (len(changed) != 1)} changed"
    if request.POST.get("resubmit"):
        messages.success(request, f"{saved}; the trajectory is submitted for review again.")
    else:
        messages.info(request, f"{saved}. Resubmit it when it is ready.")
    return redirect("trajectory", pk=pk)


@require_POST
@requires(Capability.ANNOTATE)
def trajectory_retry(request: HttpRequest, pk: int) -> HttpResponse:
    """Take the task of the annotator's rejected trajectory again, for a new attempt (the rejected one stays)."""
    trajectory = _own_trajectory(request, pk)
    try:
        assignment = trajectories.attempt_again(trajectory, request.user)
    except Conflict as exc:
        return _trajectory_page(request, trajectory, status=409, fix=str(exc))
    messages.success(request, f"Task #{assignment.task_id} is yours again: annotate it live or record it aloud.")
    return redirect("annotate")


@require_POST
@requires(Capability.REVIEW)
def trajectory_review(request: HttpRequest, pk: int) -> HttpResponse:
    """The trajectory page's review form; the same checks and effects as the verdict panel (annotation_app.rubric),
    with rubric scores (`score-<key>`) and a reason optional here."""
    trajectory = get_object_or_404(Trajectory.objects.select_related("task", "annotator", "model_version"), pk=pk)
    try:
        verdict = rubric.parse_verdict(
            rubric.rubric_for_trajectory(trajectory),
            request.POST,
            rubric.scores_from_form(request.POST),
            complete=False,
            reason_required=False,
        )
        rubric.record_verdict(trajectory, request.user, verdict)
    except rubric.RubricError as exc:
        return _trajectory_page(request, trajectory, str(exc), status=400)
    except rubric.VerdictConflict as exc:
        return _trajectory_page(request, trajectory, str(exc), status=409)
    return redirect("trajectory", pk=pk)


@require_GET
def media(request: HttpRequest, path: str) -> HttpResponse:
    """Screenshots and audio are served only to people who may see their trajectory."""
    if not request.user.is_authenticated:
        return HttpResponse("Log in to see this file.", status=401)
    parts = PurePosixPath(path).parts
    if len(parts) < 3 or parts[0] != "trajectories" or not parts[1].isdigit() or ".." in parts:
        raise Http404("No such file.")
    if not trajectories_visible_to(request.user).filter(pk=int(parts[1])).exists():
        raise Http404("No such file.")
    full = (settings.MEDIA_ROOT / path).resolve()
    if not full.is_relative_to(settings.MEDIA_ROOT.resolve()) or not full.is_file():
        raise Http404("No such file.")
    content_type = mimetypes.guess_type(full.name)[0] or "application/octet-stream"
    return ranges.file_response(request, full, content_type)  # byte ranges: audio is seekable only with them
