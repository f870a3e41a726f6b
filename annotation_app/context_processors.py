"""Template context: the navigation entries the current user's role may open."""

from django.http import HttpRequest

from .permissions import Capability, can

NAV = [
    ("annotate", "My queue", Capability.ANNOTATE),
    ("lead", "Task pool", Capability.MANAGE_TASKS),
    ("flywheel", "Flywheel", Capability.VIEW_FLYWHEEL),
]


def navigation(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    return {"nav": [(name, label) for name, label, capability in NAV if can(user, capability)]}
