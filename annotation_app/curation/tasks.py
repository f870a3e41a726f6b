"""Celery tasks of curation. `sandbox.curation_verify` runs on the `sandbox` queue (hosts near the sandbox service,
routed by the `sandbox.*` prefix); `annotation_app.curation.dedup` (beat: the incremental pass) on `default`."""

from celery import shared_task


@shared_task(name="sandbox.curation_verify", acks_late=True)
def verify_task(run_id: int) -> str:
    """Replay one queued VerificationRun in a fresh sandbox session; its final status."""
    from .verify import run_verification

    return run_verification(run_id).status


@shared_task(name="annotation_app.curation.dedup", acks_late=True)
def dedup_task(limit: int = 1000) -> dict[str, int]:
    """Sign and group the trajectories that have no signature yet (idempotent: signed ones are skipped)."""
    from .dedup import dedup_pending

    return dedup_pending(limit)
