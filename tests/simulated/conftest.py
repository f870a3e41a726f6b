"""The live-annotation stack of tests/live (policy server on the tiny checkpoint, sandbox service, a Celery worker on
`live`, gunicorn and daphne), shared here for the simulated annotators, who drive it over HTTP."""

from ..live.conftest import (  # noqa: F401  (fixtures)
    embedded_model,
    live_services,
    live_settings,
    live_web,
    live_worker,
    policy_url,
    tiny_checkpoint,
)
