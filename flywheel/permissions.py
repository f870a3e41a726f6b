"""Who may do what in the flywheel, in terms of annotation_app.permissions' capabilities: ML engineers (and
superusers) start and cancel iterations; data leads and ML engineers read iterations and the stores."""

from __future__ import annotations

from typing import Any

from annotation_app.permissions import Capability, can

RUN = Capability.MANAGE_MODELS  # start and cancel iterations (ML engineers)
READ = (Capability.VIEW_FLYWHEEL, Capability.VIEW_TRAJECTORIES)  # iterations, routes and stores


def can_run(user: Any) -> bool:
    return can(user, RUN)


def can_read(user: Any) -> bool:
    return any(can(user, c) for c in READ)
