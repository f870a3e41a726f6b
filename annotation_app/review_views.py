"""The data lead's trajectory player `/lead/trajectories/<id>/` and its JSON endpoints for step verdicts, edits,
cuts and restores. Thin: the rules live in step_edits. Data leads change steps; ML engineers see the player
read-only; annotators never open it (their own trajectories have /trajectories/<id>/)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.http import require_GET, require_POST

from . import step_edits
from .curation.flags import curation_for
from .models import Recording, Step, StepVerdict, Trajectory
from .permissions import Capability, can, requires
from .trajectories import Conflict, Invalid


@require_GET
@requires(Capability.VIEW_TRAJECTORIES)
def player(request: HttpRequest, pk: int) -> HttpResponse:
    """One screenshot at a time with its action drawn on it, the step's reasoning beside it, and (for leads) the
    step verdicts and edits."""
    trajectory = get_object_or_404(
        Trajectory.objects.select_related("task", "annotator", "model_version", "capture"), pk=pk
    )
    recording = Recording.objects.filter(trajectory=trajectory).exclude(audio="").first()
    try:
        verdict_url = reverse("lead-trajectory-verdict", args=[pk])
    except NoReverseMatch:  # the verdict panel is served by annotation_app.review_queue_views once it exists
        verdict_url = f"/lead/trajectories/{pk}/verdict/"
    context = {
        "trajectory": trajectory,
        "data": step_edits.player_data(trajectory),
        "can_edit": can(request.user, Capability.REVIEW) and trajectory.status != Trajectory.Status.IN_PROGRESS,
        "audio_url": recording.audio.url if recording else "",
        "verdicts": StepVerdict.Verdict.choices,
        "verdict_url": verdict_url,
        "curation": curation_for(trajectory),  # flags, the latest replay and its divergent steps, duplicates
    }
    return render(request, "review/player.html", context)


def _json_requires(capability: Capability) -> Callable:
    """JSON-endpoint guard: 401 for anonymous users, 403 for roles without `capability`, each with a sentence."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return JsonResponse({"detail": "Log in to review trajectories."}, status=401)
            if not can(request.user, capability):
                return JsonResponse({"detail": "Your role may not review trajectories."}, status=403)
            return view(request, *args, **kwargs)

        wrapped.capability = capability  # type: ignore[attr-defined]
        return wrapped

    return decorator


def _step(pk: int, index: int) -> tuple[Trajectory, Step]:
    trajectory = get_object_or_404(Trajectory, pk=pk)
    return trajectory, get_object_or_404(Step, trajectory=trajectory, index=index)


def _answer(change: Callable[[], Any], trajectory: Trajectory, indices: list[int]) -> JsonResponse:
    """Run a change; answer the changed steps as the player draws them, or the refusal (400/409) as a sentence."""
    try:
        change()
    except Invalid as exc:
        return JsonResponse({"detail": str(exc)}, status=400)
    except Conflict as exc:
        return JsonResponse({"detail": str(exc)}, status=409)
    steps = step_edits.steps_queryset(trajectory).filter(index__in=indices)
    return JsonResponse({"steps": [step_edits.step_json(s) for s in steps]})


def _not_found(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A missing trajectory or step answers JSON 404 with a sentence, like the other refusals."""

    @wraps(view)
    def wrapped(request: HttpRequest, pk: int, index: int) -> HttpResponse:
        if not Step.objects.filter(trajectory_id=pk, index=index).exists():
            return JsonResponse({"detail": f"Trajectory {pk} has no step {index}."}, status=404)
        return view(request, pk, index)

    return wrapped


@require_POST
@_json_requires(Capability.REVIEW)
@_not_found
def step_verdict(request: HttpRequest, pk: int, index: int) -> JsonResponse:
    """POST verdict (ok, wrong_action, wrong_thought, bad_screenshot) and an optional note."""
    trajectory, step = _step(pk, index)
    verdict, note = request.POST.get("verdict", ""), request.POST.get("note", "")
    return _answer(lambda: step_edits.set_verdict(step, request.user, verdict, note), trajectory, [index])


@require_POST
@_json_requires(Capability.REVIEW)
@_not_found
def step_edit(request: HttpRequest, pk: int, index: int) -> JsonResponse:
    """POST field (thought or action) and value: the step's new thought, or its new action text."""
    trajectory, step = _step(pk, index)
    field, value = request.POST.get("field", ""), request.POST.get("value", "")
    if field == "thought":
        return _answer(lambda: step_edits.edit_thought(step, request.user, value), trajectory, [index])
    if field == "action":
        return _answer(lambda: step_edits.edit_action(step, request.user, value), trajectory, [index])
    return JsonResponse({"detail": f"'{field}' cannot be edited; edit the thought or the action."}, status=400)


@require_POST
@_json_requires(Capability.REVIEW)
@_not_found
def step_check(request: HttpRequest, pk: int, index: int) -> JsonResponse:
    """POST action: its typed form and points if it is valid on this trajectory's screen (the preview), else 400."""
    trajectory, _ = _step(pk, index)
    try:
        actions = step_edits.check_action(
            request.POST.get("action", ""), trajectory.screen_width, trajectory.screen_height
        )
    except Invalid as exc:
        return JsonResponse({"detail": str(exc)}, status=400)
    return JsonResponse({"actions": actions})


@require_POST
@_json_requires(Capability.REVIEW)
@_not_found
def step_cut(request: HttpRequest, pk: int, index: int) -> JsonResponse:
    """Cut the trajectory at this step: it and the later ones are left out of exports and validation."""
    trajectory, _ = _step(pk, index)
    later = list(trajectory.steps.filter(index__gte=index).values_list("index", flat=True))
    return _answer(lambda: step_edits.cut(trajectory, request.user, index), trajectory, later)


@require_POST
@_json_requires(Capability.REVIEW)
@_not_found
def step_restore(request: HttpRequest, pk: int, index: int) -> JsonResponse:
    """Undo a cut from this step on."""
    trajectory, _ = _step(pk, index)
    later = list(trajectory.steps.filter(index__gte=index).values_list("index", flat=True))
    return _answer(lambda: step_edits.restore(trajectory, request.user, index), trajectory, later)
