"""Who may do what: the one place where roles become permissions, for pages and API alike.

Every view names a capability; `can(user, capability)` answers it from `GRANTS`, and the `*_visible_to` helpers
narrow querysets to the rows a user may see. Superusers hold every capability.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from rest_framework.permissions import BasePermission

from .models import LiveSession, Role, Task, Trajectory


class Capability(StrEnum):
    ANNOTATE = "annotate"  # take tasks from the queue, record trajectories of one's own
    VIEW_TASKS = "view_tasks"  # see tasks (annotators: only those assigned to them)
    MANAGE_TASKS = "manage_tasks"  # create, import, edit, archive tasks
    VIEW_TRAJECTORIES = "view_trajectories"  # see every trajectory, not just one's own
    REVIEW = "review"  # approve or reject submitted trajectories
    VIEW_FLYWHEEL = "view_flywheel"  # flywheel overview and model registry
    MANAGE_MODELS = "manage_models"  # register and promote model versions
    MANAGE_WEBHOOKS = "manage_webhooks"  # add webhooks, read their secrets and delivery log


GRANTS: dict[str, frozenset[Capability]] = {
    Role.ANNOTATOR: frozenset({Capability.ANNOTATE, Capability.VIEW_TASKS}),
    Role.DATA_LEAD: frozenset(
        {
            Capability.VIEW_TASKS,
            Capability.MANAGE_TASKS,
            Capability.VIEW_TRAJECTORIES,
            Capability.REVIEW,
            Capability.MANAGE_WEBHOOKS,
        }
    ),
    Role.ML_ENGINEER: frozenset(
        {
            Capability.VIEW_TASKS,
            Capability.VIEW_TRAJECTORIES,
            Capability.VIEW_FLYWHEEL,
            Capability.MANAGE_MODELS,
            Capability.MANAGE_WEBHOOKS,
        }
    ),
}


def can(user: Any, capability: Capability) -> bool:
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    if user.is_superuser:
        return True
    return capability in GRANTS.get(user.role, frozenset())


def tasks_visible_to(user: Any, queryset: QuerySet[Task] | None = None) -> QuerySet[Task]:
    queryset = Task.objects.all() if queryset is None else queryset
    if can(user, Capability.MANAGE_TASKS) or can(user, Capability.VIEW_TRAJECTORIES):
        return queryset
    if can(user, Capability.ANNOTATE):
        return queryset.filter(assignments__annotator=user).distinct()
    return queryset.none()


def trajectories_visible_to(user: Any, queryset: QuerySet[Trajectory] | None = None) -> QuerySet[Trajectory]:
    queryset = Trajectory.objects.all() if queryset is None else queryset
    if can(user, Capability.VIEW_TRAJECTORIES):
        return queryset
    if can(user, Capability.ANNOTATE):
        return queryset.filter(annotator=user)
    return queryset.none()


def can_edit_trajectory(user: Any, trajectory: Trajectory) -> bool:
    """Steps and recordings are added by the trajectory's own annotator while it is still in progress."""
    return (
        can(user, Capability.ANNOTATE)
        and trajectory.annotator_id == user.pk
        and trajectory.status == Trajectory.Status.IN_PROGRESS
    )


def own_live_session(user: Any, trajectory_id: int) -> LiveSession | None:
    """A live session is seen and driven only by its own annotator: nobody else may open or watch it."""
    if not can(user, Capability.ANNOTATE):
        return None
    return (
        LiveSession.objects.select_related("trajectory")
        .filter(trajectory_id=trajectory_id, trajectory__annotator=user)
        .first()
    )


def requires(capability: Capability) -> Callable:
    """Page-view decorator: anonymous users go to the login page, others without the capability get a 403."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not can(request.user, capability):
                raise PermissionDenied(f"Your role may not {capability.value.replace('_', ' ')}.")
            return view(request, *args, **kwargs)

        wrapped.capability = capability  # type: ignore[attr-defined]
        return wrapped

    return decorator


def allows(*capabilities: Capability) -> type[BasePermission]:
    """DRF permission class granting access when the user holds any of `capabilities`."""

    class HasCapability(BasePermission):
        message = "Your role may not " + " or ".join(c.value.replace("_", " ") for c in capabilities) + "."

        def has_permission(self, request: Any, view: Any) -> bool:
            return any(can(request.user, c) for c in capabilities)

    HasCapability.__name__ = "Allows_" + "_or_".join(c.value for c in capabilities)
    return HasCapability
