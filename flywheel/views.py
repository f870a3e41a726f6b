"""The flywheel's pages: the ML engineer's overview (start and watch iterations, the model registry), an
iteration's page, the stores (also for data leads) and downloads of their files. Views parse and call
flywheel.iterations; the live panel refreshes on the `flywheel_iteration` websocket event (and polls while running)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Count
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from annotation_app.models import Trajectory
from annotation_app.permissions import Capability, can, requires

from .forms import UNAVAILABLE_STAGES, IterationForm
from .iterations import IterationError, cancel_iteration, route_counts_by, routing_summary, start_iteration
from .models import DatasetVersion, Iteration, ModelVersion, Route
from .permissions import RUN, can_read, can_run
from .serving import serving_problem


def reads_stores(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Page decorator: anonymous users go to the login page; roles that may not read the stores get a 403."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not can_read(request.user):
            raise PermissionDenied("Your role may not view the flywheel's iterations and stores.")
        return view(request, *args, **kwargs)

    return wrapped


def _iterations_panel(request: HttpRequest) -> HttpResponse:
    iterations = list(Iteration.objects.select_related("started_by", "base_model")[:20])
    context = {
        "iterations": iterations,
        "busy": any(not i.finished for i in iterations),
        "can_run": can_run(request.user),
    }
    return render(request, "flywheel/_iterations.html", context)


@require_GET
@requires(Capability.VIEW_FLYWHEEL)
def overview(request: HttpRequest) -> HttpResponse:
    if request.htmx and request.GET.get("panel") == "iterations":
        return _iterations_panel(request)
    return _overview(request, IterationForm())


def _overview(request: HttpRequest, form: IterationForm, status: int = 200) -> HttpResponse:
    by_mode_status = Trajectory.objects.values_list("mode", "status").annotate(n=Count("id")).order_by()
    table = {mode: {status: 0 for status in Trajectory.Status.values} for mode in Trajectory.Mode.values}
    for mode, state, n in by_mode_status:
        table[mode][state] = n
    iterations = list(Iteration.objects.select_related("started_by", "base_model")[:20])
    context = {
        "models": ModelVersion.objects.annotate(trajectory_count=Count("trajectories"))[:50],
        "table": [
            (Trajectory.Mode(mode).label, [row[s] for s in Trajectory.Status.values]) for mode, row in table.items()
        ],
        "statuses": Trajectory.Status.labels,
        "can_promote": can(request.user, Capability.MANAGE_MODELS),
        "can_run": can_run(request.user),
        "form": form,
        "unavailable": UNAVAILABLE_STAGES,
        "iterations": iterations,
        "busy": any(not i.finished for i in iterations),
        "versions": DatasetVersion.objects.select_related("parent", "iteration")[:20],
    }
    return render(request, "flywheel/overview.html", context, status=status)


@require_POST
@requires(RUN)
def start(request: HttpRequest) -> HttpResponse:
    form = IterationForm(request.POST)
    if not form.is_valid():
        return _overview(request, form, status=400)
    data = form.cleaned_data
    try:
        with transaction.atomic():
            iteration = start_iteration(
                request.user,
                base_model=data["base_model"],
                scope=data["scope"],
                modes=data["modes"],
                domains=data["domains"],
                date_from=data["date_from"],
                date_to=data["date_to"],
                stages=data["stages"],
                config=form.config(),
            )
    except IterationError as exc:
        form.add_error(None, str(exc))
        return _overview(request, form, status=400)
    messages.info(request, f"Iteration {iteration.pk} queued.")
    return redirect("flywheel-iteration", pk=iteration.pk)


@require_POST
@requires(RUN)
def cancel(request: HttpRequest, pk: int) -> HttpResponse:
    iteration = get_object_or_404(Iteration, pk=pk)
    try:
        cancel_iteration(iteration)
    except IterationError as exc:
        return HttpResponse(str(exc), status=409, content_type="text/plain")
    messages.info(request, f"Iteration {pk}: cancel requested.")
    return redirect("flywheel-iteration", pk=pk)


@require_GET
@reads_stores
def iteration_detail(request: HttpRequest, pk: int) -> HttpResponse:
    iteration = get_object_or_404(Iteration.objects.select_related("started_by", "base_model"), pk=pk)
    context = {"it": iteration, "can_run": can_run(request.user)}
    if request.htmx:
        if iteration.finished and request.GET.get("seen") == "running":
            # The page's other panels (routes, held back, store versions) were drawn before the end: load it anew.
            response = HttpResponse(status=204)
            response["HX-Refresh"] = "true"
            return response
        return render(request, "flywheel/_iteration_status.html", context)
    context.update(
        summary=routing_summary(iteration),
        by_mode=route_counts_by(iteration, "trajectory__mode"),
        by_domain=route_counts_by(iteration, "trajectory__task__domain"),
        held=iteration.validations.filter(route=Route.HELD).order_by("trajectory_id")[:50],
        versions=iteration.dataset_versions.select_related("parent"),
        routes=Route.values,
    )
    return render(request, "flywheel/iteration.html", context)


@require_GET
@reads_stores
def stores(request: HttpRequest) -> HttpResponse:
    versions = DatasetVersion.objects.select_related("parent", "iteration").order_by("kind", "-number")
    return render(request, "flywheel/stores.html", {"versions": versions})


@require_GET
@reads_stores
def dataset_file(request: HttpRequest, pk: int, path: str) -> FileResponse:
    """A file of a store version, by its manifest name (nothing outside the manifest is served)."""
    version = get_object_or_404(DatasetVersion, pk=pk)
    if path not in {f["path"] for f in version.manifest.get("files", [])}:
        raise Http404("No such file in this version.")
    name = f"{version.manifest['root']}/{path}"
    if not default_storage.exists(name):
        raise Http404("The file is missing from storage.")
    return FileResponse(default_storage.open(name, "rb"), as_attachment=True, filename=path)


@require_POST
@requires(Capability.MANAGE_MODELS)
def promote(request: HttpRequest, pk: int) -> HttpResponse:
    """Make the model the annotation model, once its endpoint answers; `force` promotes it anyway."""
    model = get_object_or_404(ModelVersion, pk=pk)
    problem = None if request.POST.get("force") else serving_problem(model)
    if problem:
        messages.error(request, f"{model.name} was not promoted: {problem}. Tick 'even if it cannot serve' to force.")
    else:
        model.promote()
        messages.success(request, f"{model.name} is now the annotation model.")
    return redirect("flywheel")
