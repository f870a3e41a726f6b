"""Template context: the navigation entries the current user's role may open."""

from django.conf import settings
from django.http import HttpRequest
from django.http.request import split_domain_port

from .permissions import Capability, can

# (url name, label, capability needed, capability whose holders get a better entry instead)
NAV: list[tuple[str, str, Capability, Capability | None]] = [
    ("annotate", "My queue", Capability.ANNOTATE, None),
    ("insitu", "Think-aloud", Capability.ANNOTATE, None),
    ("lead", "Task pool", Capability.MANAGE_TASKS, None),
    ("lead-trajectories", "Trajectories", Capability.VIEW_TRAJECTORIES, None),
    ("lead-review-queue", "Review", Capability.REVIEW, None),
    ("lead-agreement", "Agreement", Capability.REVIEW, None),
    ("curation", "Curation", Capability.VIEW_TRAJECTORIES, None),
    ("flywheel", "Flywheel", Capability.VIEW_FLYWHEEL, None),
    # Data leads read the stores and the model registry (the flywheel overview links both for ML engineers).
    ("flywheel-stores", "Stores", Capability.VIEW_TRAJECTORIES, Capability.VIEW_FLYWHEEL),
    ("flywheel-models", "Models", Capability.VIEW_TRAJECTORIES, Capability.VIEW_FLYWHEEL),
    ("quality", "Quality", Capability.VIEW_TRAJECTORIES, None),
    ("webhooks", "Webhooks", Capability.MANAGE_WEBHOOKS, None),
]


def navigation(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    return {
        "nav": [
            (name, label)
            for name, label, capability, unless in NAV
            if can(user, capability) and not (unless and can(user, unless))
        ],
        "events_url": events_url(request),
    }


def events_url(request: HttpRequest) -> str:
    return ws_url(request, "/ws/events/")


def ws_url(request: HttpRequest, path: str) -> str:
    """Where a page's websocket goes: daphne's port on this host, or this origin when a proxy routes /ws/."""
    if not settings.WS_PUBLIC_PORT:
        return path
    scheme = "wss" if request.is_secure() else "ws"
    host, _ = split_domain_port(request.get_host())
    return f"{scheme}://{host}:{settings.WS_PUBLIC_PORT}{path}"
