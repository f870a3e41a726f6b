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

from .forms import IterationForm, RegisterModelForm, unavailable_stages
from .iterations import IterationError, cancel_iteration, route_counts_by, routing_summary, start_iteration
from .models import DatasetVersion, Iteration, ModelPromotion, ModelVersion, Route
from .permissions import RUN, can_read, can_run
from .registry import NotServable, RegistryError, register_by_hand
from .registry import demote as registry_demote
from .registry import promote as registry_promote
from .registry import rollback as registry_rollback
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
        "models": ModelVersion.objects.select_related("parent").annotate(trajectory_count=Count("trajectories"))[:50],
        "table": [
            (Trajectory.Mode(mode).label, [row[s] for s in Trajectory.Status.values]) for mode, row in table.items()
        ],
        "statuses": Trajectory.Status.labels,
        "can_promote": can(request.user, Capability.MANAGE_MODELS),
        "can_run": can_run(request.user),
        "form": form,
        "unavailable": unavailable_stages(),
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
    except IterationError as exc:  # shown on the iteration's page, with the 409
        messages.error(request, f"Not cancelled: {exc}.")
        return _iteration_page(request, iteration, status=409)
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
    return _iteration_page(request, iteration)


def _iteration_page(request: HttpRequest, iteration: Iteration, status: int = 200) -> HttpResponse:
    iteration.refresh_from_db()
    context = {
        "it": iteration,
        "can_run": can_run(request.user),
        "summary": routing_summary(iteration),
        "by_mode": route_counts_by(iteration, "trajectory__mode"),
        "by_domain": route_counts_by(iteration, "trajectory__task__domain"),
        "held": iteration.validations.filter(route=Route.HELD).order_by("trajectory_id")[:50],
        "versions": iteration.dataset_versions.select_related("parent"),
        "routes": Route.values,
    }
    return render(request, "flywheel/iteration.html", context, status=status)


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


# --- the model registry ----------------------------------------------------------------------------------------------


def _registry_context(request: HttpRequest) -> dict[str, Any]:
    models = list(
        ModelVersion.objects.select_related("parent", "iteration", "created_by")
        .prefetch_related("dataset_versions")
        .annotate(trajectory_count=Count("trajectories"))
    )
    active = next((m for m in models if m.is_active), None)
    history = list(ModelPromotion.objects.select_related("from_model", "to_model", "by")[:200])
    for model in models:
        model.history = [h for h in history if model.pk in (h.from_model_id, h.to_model_id)]
        model.can_roll_back = rollback_target(model, active, history)
    return {
        "models": models,
        "active": active,
        "history": history[:50],
        "can_manage": can(request.user, Capability.MANAGE_MODELS),
    }


def rollback_target(model: ModelVersion, active: ModelVersion | None, history: list[ModelPromotion]) -> bool:
    """Whether the page offers 'Roll back' to `model`: an earlier model than the active one, or one active before."""
    if active is None or model.pk == active.pk:
        return False
    return (model.created_at, model.pk) < (active.created_at, active.pk) or any(
        h.to_model_id == model.pk for h in history
    )


def _registry_panel(request: HttpRequest, *, error: str = "", done: str = "", status: int = 200) -> HttpResponse:
    context = {**_registry_context(request), "error": error, "done": done}
    return render(request, "flywheel/_registry.html", context, status=status)


def _registry_answer(request: HttpRequest, *, error: str = "", done: str = "", status: int = 200) -> HttpResponse:
    """htmx: the registry panel with the outcome (a 4xx carries the reason); a plain form post: back to the page."""
    if request.htmx:
        return _registry_panel(request, error=error, done=done, status=status if error else 200)
    if error:
        messages.error(request, error)
    else:
        messages.success(request, done)
    return redirect("flywheel-models")


@require_GET
@reads_stores
def registry(request: HttpRequest) -> HttpResponse:
    """Every model with its lineage, evaluation, endpoint, serve command and promotion history."""
    if request.htmx and request.GET.get("panel") == "registry":
        return _registry_panel(request)
    context = {**_registry_context(request), "register_form": RegisterModelForm()}
    return render(request, "flywheel/registry.html", context)


@require_GET
@reads_stores
def model_health(request: HttpRequest, pk: int) -> HttpResponse:
    """Whether the model's endpoint serves it now (loaded into the registry page after it is drawn)."""
    model = get_object_or_404(ModelVersion, pk=pk)
    return render(request, "flywheel/_health.html", {"model": model, "problem": serving_problem(model)})


@require_POST
@requires(RUN)
def register(request: HttpRequest) -> HttpResponse:
    form = RegisterModelForm(request.POST)
    model = None
    if form.is_valid():
        data = form.cleaned_data
        try:
            model = register_by_hand(request.user, **data)
        except RegistryError as exc:
            form.add_error(None, str(exc))
    if model is None:
        if request.htmx:
            return render(request, "flywheel/_register.html", {"register_form": form}, status=400)
        context = {**_registry_context(request), "register_form": form}
        return render(request, "flywheel/registry.html", context, status=400)
    done = f"{model.name} is registered."
    if request.htmx:
        response = render(request, "flywheel/_register.html", {"register_form": RegisterModelForm(), "done": done})
        response["HX-Trigger"] = "registry-changed"
        return response
    messages.success(request, done)
    return redirect("flywheel-models")


def _change(request: HttpRequest, change: Callable[[], str]) -> HttpResponse:
    try:
        done = change()
    except NotServable as exc:
        return _registry_answer(request, error=f"{exc}. Tick 'even if it cannot serve' to force it.", status=409)
    except RegistryError as exc:
        return _registry_answer(request, error=str(exc), status=409)
    return _registry_answer(request, done=done)


@require_POST
@requires(Capability.MANAGE_MODELS)
def promote(request: HttpRequest, pk: int) -> HttpResponse:
    """Make the model the annotation model, once its endpoint answers; `force` promotes it anyway."""
    model = get_object_or_404(ModelVersion, pk=pk)
    force, reason = bool(request.POST.get("force")), request.POST.get("reason", "").strip()

    def change() -> str:
        registry_promote(model, by=request.user, force=force, reason=reason)
        return f"{model.name} is now the annotation model."

    return _change(request, change)


@require_POST
@requires(Capability.MANAGE_MODELS)
def rollback(request: HttpRequest, pk: int) -> HttpResponse:
    """Go back to an earlier model (promote it, recorded as a rollback)."""
    model = get_object_or_404(ModelVersion, pk=pk)
    force, reason = bool(request.POST.get("force")), request.POST.get("reason", "").strip()

    def change() -> str:
        registry_rollback(model, by=request.user, force=force, reason=reason)
        return f"Rolled back: {model.name} is the annotation model again."

    return _change(request, change)


@require_POST
@requires(Capability.MANAGE_MODELS)
def demote(request: HttpRequest) -> HttpResponse:
    """Leave no model active."""
    reason = request.POST.get("reason", "").strip()

    def change() -> str:
        record = registry_demote(by=request.user, reason=reason)
        return f"{record.from_model} is no longer the annotation model; none is active."

    return _change(request, change)
