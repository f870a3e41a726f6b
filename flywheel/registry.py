"""The model registry's state changes: register a trained model with its lineage (and make it servable), record its
evaluation, and promote, roll back or demote the annotation model, each change written as a ModelPromotion.

Views, the API and the training stages only parse and call these. The automatic-promotion rule (`beats`): the new
model's held-out success rate must be *strictly higher* than the active model's (point estimates), compared on the
same evaluation run when the active model is the new model's parent (the EVALUATE stage evaluates both on the same
held-out tasks), else against the active model's own recorded evaluation; a model that cannot serve is never
promoted automatically.
"""

from __future__ import annotations

import logging
import shlex
from typing import Any

import httpx
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from annotation_app.consumers import notify_role
from annotation_app.models import Role
from training.policy.client import PolicyError, load_model

from .models import Iteration, ModelPromotion, ModelVersion, Stage, lock_registry
from .serving import serving_problem

log = logging.getLogger(__name__)

EVENT = "flywheel_models"  # pushed to the registry pages of ML engineers and data leads
VLLM_PORT = 8000


class RegistryError(ValueError):
    """A registry change that cannot be made; the message says why (a 400 or 409 to callers)."""


class NotServable(RegistryError):
    """The model's endpoint cannot serve it; `force` promotes it anyway."""


# --- registering -----------------------------------------------------------------------------------------------------


def serve_command(name: str, checkpoint: str) -> str:
    """The `vllm serve` command (docs/live-annotation.md) that serves `checkpoint` as `name` on a GPU host."""
    images = max(int(getattr(settings, "LIVE_KEEP_IMAGES", 5)), 1)
    parts = ["vllm", "serve", checkpoint, "--served-model-name", name, "--host", "0.0.0.0", "--port", str(VLLM_PORT)]
    parts += ["--max-model-len", "32768", "--limit-mm-per-prompt", f'{{"image": {images}}}']
    return shlex.join(parts)


def load_into_embedded_server(name: str, checkpoint: str, *, replace: bool = False) -> str | None:
    """Have the embedded policy server serve `checkpoint` as `name` (training.policy.client.load_model: POST
    {EMBEDDED_POLICY_URL}/models/load; the same name and checkpoint again is a no-op there); with `replace` the name
    is unloaded first (it moves to a new checkpoint). None when it serves it, else why not. Never raises: a model
    that cannot be loaded is still registered."""
    base, key = settings.EMBEDDED_POLICY_URL, settings.POLICY_API_KEY
    if replace:
        problem = unload_from_embedded_server(name)
        if problem:
            return problem
    try:
        load_model(base, name, checkpoint, api_key=key)
    except PolicyError as exc:
        return str(exc)
    return None


def unload_from_embedded_server(name: str) -> str | None:
    """Have the embedded policy server drop `name` (DELETE /models/<name>; a name it does not serve is no error).
    None when it answered, else why not."""
    base, key = settings.EMBEDDED_POLICY_URL, settings.POLICY_API_KEY
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        httpx.delete(f"{base.rstrip('/')}/models/{name}", headers=headers, timeout=settings.POLICY_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return f"the embedded policy server did not answer DELETE /models/{name} ({exc or type(exc).__name__})"
    return None


def _free_name(wanted: str) -> str:
    name, n = wanted, 2
    while ModelVersion.objects.filter(name=name).exists():
        name, n = f"{wanted}-{n}", n + 1
    return name


def register_model(iteration: Iteration, *, stage: str, checkpoint: str, metrics: dict[str, Any]) -> ModelVersion:
    """Register the model an iteration's training stage made, with its lineage (the iteration, the stage, the base
    model as parent, the iteration's store versions), its metrics and its `vllm serve` command, and load it into the
    embedded policy server. Idempotent per (iteration, stage): a rerun returns the same row (checkpoint and metrics
    brought up to date, loading retried when it had failed)."""
    if stage not in Stage.values:
        raise RegistryError(f"unknown stage {stage!r} (known: {', '.join(Stage.values)})")
    if not checkpoint:
        raise RegistryError("a model needs its checkpoint path")
    if not isinstance(metrics, dict):
        raise RegistryError("metrics must be a JSON object")
    moved = False
    with transaction.atomic():
        with connection.cursor() as cursor:  # one registration per (iteration, stage) at a time
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"flywheel.register.{iteration.pk}.{stage}"])
        model = ModelVersion.objects.filter(iteration=iteration, stage=stage).first()
        if model is None:
            name = _free_name(f"it{iteration.pk}-{stage}")
            model = ModelVersion.objects.create(
                name=name,
                checkpoint_uri=checkpoint,
                parent=iteration.base_model,
                iteration=iteration,
                stage=stage,
                metrics=metrics,
                created_by=iteration.started_by,
                serve_command=serve_command(name, checkpoint),
            )
            model.dataset_versions.set(iteration.dataset_versions.all())
        else:
            moved = model.checkpoint_uri != checkpoint
            model.checkpoint_uri, model.metrics = checkpoint, metrics
            model.serve_command = serve_command(model.name, checkpoint)
            model.save(update_fields=["checkpoint_uri", "metrics", "serve_command"])
            model.dataset_versions.add(*iteration.dataset_versions.all())
    embedded = model.endpoint_url in ("", settings.EMBEDDED_POLICY_URL)
    if not model.endpoint_url or (moved and embedded):  # outside the transaction: loading takes a while
        problem = load_into_embedded_server(model.name, checkpoint, replace=moved)
        if problem is None:
            model.endpoint_url, model.served_name = settings.EMBEDDED_POLICY_URL, model.name
            model.notes = ""
        else:
            log.warning("model %s is registered but not served: %s", model.name, problem)
            model.endpoint_url, model.served_name = "", ""
            model.notes = f"Not served: {problem}. Serve it with the command below and set its endpoint."
        model.save(update_fields=["endpoint_url", "served_name", "notes"])
    push()
    return model


def register_by_hand(
    user: Any,
    *,
    name: str,
    checkpoint_uri: str,
    endpoint_url: str = "",
    served_name: str = "",
    parent: ModelVersion | None = None,
    notes: str = "",
) -> ModelVersion:
    """Register a model an ML engineer trained or serves elsewhere (the page's form and POST /api/flywheel/models/)."""
    name, checkpoint_uri = name.strip(), checkpoint_uri.strip()
    if not name or not checkpoint_uri:
        raise RegistryError("a model needs a name and a checkpoint")
    if ModelVersion.objects.filter(name=name).exists():
        raise RegistryError(f"a model named {name!r} is already registered")
    model = ModelVersion.objects.create(
        name=name,
        checkpoint_uri=checkpoint_uri,
        endpoint_url=endpoint_url.strip(),
        served_name=served_name.strip(),
        parent=parent,
        notes=notes,
        created_by=user if getattr(user, "pk", None) else None,
        serve_command=serve_command(served_name.strip() or name, checkpoint_uri),
    )
    push()
    return model


# --- evaluation and automatic promotion ------------------------------------------------------------------------------


def _check_result(result: Any, what: str) -> dict[str, Any]:
    if not isinstance(result, dict):
        raise RegistryError(f"{what} must be a JSON object")
    rate = result.get("success_rate")
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0.0 <= rate <= 1.0:
        raise RegistryError(f"{what}.success_rate must be a number from 0 to 1, not {rate!r}")
    return dict(result)


def record_evaluation(model: ModelVersion, result: dict[str, Any], parent_result: dict[str, Any] | None) -> None:
    """Store the model's held-out evaluation ({success_rate, ci_low, ci_high, successes, episodes, by_task, …}) and
    its parent's from the same run beside it."""
    new = _check_result(result, "result")
    parent = None if parent_result is None else _check_result(parent_result, "parent_result")
    model.evaluation = {
        **{k: v for k, v in (model.evaluation or {}).items() if k == "promotion"},
        "new": new,
        "parent": parent,
        "parent_id": model.parent_id,
        "iteration": model.iteration_id,
        "recorded_at": timezone.now().isoformat(),
    }
    model.save(update_fields=["evaluation"])
    push()


def held_out_rate(model: ModelVersion) -> float | None:
    """The model's own held-out success rate, when it was evaluated."""
    rate = ((model.evaluation or {}).get("new") or {}).get("success_rate")
    return float(rate) if isinstance(rate, int | float) else None


def beats(model: ModelVersion, active: ModelVersion | None) -> tuple[bool, str]:
    """Whether `model` should replace `active` as the annotation model, and why (see the module's docstring)."""
    new_rate = held_out_rate(model)
    if new_rate is None:
        return False, f"{model.name} has no held-out evaluation"
    if active is None:
        return True, f"no model was active; {model.name} succeeded on {new_rate:.1%} of held-out episodes"
    if active.pk == model.pk:
        return False, f"{model.name} is already the annotation model"
    evaluation = model.evaluation or {}
    parent = evaluation.get("parent") or {}
    if active.pk == model.parent_id and isinstance(parent.get("success_rate"), int | float):
        active_rate, where = float(parent["success_rate"]), "in the same evaluation"
    else:
        active_rate, where = held_out_rate(active), "in its own evaluation"
        if active_rate is None:
            return False, f"the active model {active.name} has no held-out evaluation to compare with"
    verdict = "beats" if new_rate > active_rate else "does not beat"
    return new_rate > active_rate, (
        f"{model.name} {verdict} {active.name}: held-out success {new_rate:.1%} vs {active_rate:.1%} ({where})"
    )


def auto_promote(iteration: Iteration, model: ModelVersion) -> bool:
    """Promote `model` when it beats the active model (`beats`) and its endpoint serves it; the decision and its reason
    are recorded on the model (`evaluation.promotion`), a promotion also as a ModelPromotion. Returns whether it
    promoted."""
    model.refresh_from_db()
    active = ModelVersion.objects.filter(is_active=True).first()
    promote_it, reason = beats(model, active)
    if promote_it and (problem := serving_problem(model)):
        promote_it, reason = False, f"{reason}, but it cannot serve: {problem}"
    reason = f"iteration {iteration.pk}: {reason}"
    if promote_it:
        model.promote(action=ModelPromotion.Action.AUTO, by=iteration.started_by, reason=reason)
    model.evaluation = {**(model.evaluation or {}), "promotion": {"promoted": promote_it, "reason": reason}}
    model.save(update_fields=["evaluation"])
    push()
    return promote_it


# --- promote, roll back, demote --------------------------------------------------------------------------------------


def promote(model: ModelVersion, *, by: Any, force: bool = False, reason: str = "") -> ModelPromotion:
    """Make `model` the annotation model once its endpoint serves it (NotServable says why); `force` skips the check."""
    if model.is_active:
        raise RegistryError(f"{model.name} is already the annotation model")
    if not force and (problem := serving_problem(model)):
        raise NotServable(f"{model.name} was not promoted: {problem}")
    record = model.promote(by=by, forced=force, reason=reason)
    push()
    return record


def rollback(model: ModelVersion, *, by: Any, force: bool = False, reason: str = "") -> ModelPromotion:
    """Go back to an earlier model: one registered before the active one, or one that was active before."""
    active = ModelVersion.objects.filter(is_active=True).first()
    if active is None:
        raise RegistryError("no model is active, so there is nothing to roll back from: promote one instead")
    if active.pk == model.pk:
        raise RegistryError(f"{model.name} is the annotation model already")
    earlier = (model.created_at, model.pk) < (active.created_at, active.pk)
    if not earlier and not model.promotions_to.exists():
        raise RegistryError(f"{model.name} is newer than {active.name} and was never active: promote it instead")
    if not force and (problem := serving_problem(model)):
        raise NotServable(f"{model.name} was not rolled back to: {problem}")
    record = model.promote(by=by, action=ModelPromotion.Action.ROLLBACK, forced=force, reason=reason)
    push()
    return record


def demote(*, by: Any, reason: str = "") -> ModelPromotion:
    """Leave no model active (live annotation then refuses to start until one is promoted)."""
    with transaction.atomic():
        lock_registry()
        active = ModelVersion.objects.filter(is_active=True).first()
        if active is None:
            raise RegistryError("no model is active")
        ModelVersion.objects.filter(pk=active.pk).update(is_active=False)
        record = ModelPromotion.objects.create(
            action=ModelPromotion.Action.DEMOTE,
            from_model=active,
            to_model=None,
            by=by if getattr(by, "pk", None) else None,
            reason=reason,
        )
    push()
    return record


def push() -> None:
    """Tell the open registry pages, once committed, that a model changed (a courtesy: pages also load anew)."""
    transaction.on_commit(_push)


def _push() -> None:
    for role in (Role.ML_ENGINEER, Role.DATA_LEAD):
        try:
            notify_role(role, EVENT)
        except Exception:
            log.warning("could not push a registry change", exc_info=True)
