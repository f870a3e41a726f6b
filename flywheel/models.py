"""The model registry: every policy checkpoint the flywheel trains (with its lineage: iteration, stage, data versions,
parent, evaluation, promotion history), which one proposes actions to annotators, and the flywheel's iterations,
validations and store versions."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Q


class ModelVersion(models.Model):
    """A trained policy checkpoint and where it is served (an OpenAI-compatible endpoint such as `vllm serve`)."""

    name = models.CharField(max_length=100, unique=True)
    checkpoint_uri = models.CharField(max_length=500, help_text="Path or URI of the weights.")
    endpoint_url = models.URLField(blank=True, help_text="OpenAI-compatible base URL serving this checkpoint.")
    served_name = models.CharField(
        max_length=200, blank=True, help_text="Model name the endpoint serves it under (vLLM --served-model-name)."
    )
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    is_active = models.BooleanField(default=False, help_text="The model that proposes actions in live annotation.")
    metrics = models.JSONField(default=dict, blank=True)
    notes = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    # Lineage: what trained it (empty for a model registered by hand).
    iteration = models.ForeignKey(
        "Iteration", null=True, blank=True, on_delete=models.SET_NULL, related_name="trained_models"
    )
    stage = models.CharField(max_length=10, blank=True, help_text="The iteration's stage that trained it (sft, ppo…).")
    dataset_versions = models.ManyToManyField(
        "DatasetVersion", blank=True, related_name="trained_models", help_text="The store versions it was trained on."
    )
    evaluation = models.JSONField(
        default=dict,
        blank=True,
        help_text='{"new": {success_rate, ci_low, ci_high, successes, episodes, by_task…}, "parent": {…} | null, '
        '"parent_id", "iteration", "recorded_at", "promotion": {promoted, reason}}',
    )
    serve_command = models.TextField(blank=True, help_text="The `vllm serve` command that serves it on a GPU host.")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["is_active"], condition=Q(is_active=True), name="one_active_model"),
            models.UniqueConstraint(
                fields=["iteration", "stage"], condition=Q(iteration__isnull=False), name="one_model_per_stage"
            ),
        ]

    def __str__(self) -> str:
        return self.name + (" (active)" if self.is_active else "")

    @property
    def model_name(self) -> str:
        return self.served_name or self.name

    @transaction.atomic
    def promote(
        self, *, by: Any = None, action: str = "promote", forced: bool = False, reason: str = ""
    ) -> ModelPromotion:
        """Make this the annotation model; the previously active one steps down in the same transaction, and the
        change is recorded as a ModelPromotion (flywheel.registry checks serving first; this does not)."""
        lock_registry()
        previous = ModelVersion.objects.filter(is_active=True).exclude(pk=self.pk).first()
        ModelVersion.objects.filter(is_active=True).exclude(pk=self.pk).update(is_active=False)
        ModelVersion.objects.filter(pk=self.pk).update(is_active=True)
        self.is_active = True
        return ModelPromotion.objects.create(
            action=action,
            from_model=previous,
            to_model=self,
            by=by if getattr(by, "pk", None) else None,
            forced=forced,
            reason=reason,
        )


def lock_registry() -> None:
    """Serialise changes of the active model (a transaction-scoped advisory lock): two promotions at once would
    otherwise both see no active model and one would fail on the one-active constraint."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext('flywheel.registry.active'))")


class ModelPromotion(models.Model):
    """One change of the annotation model: who, when, from which model to which, forced or not, and why."""

    class Action(models.TextChoices):
        PROMOTE = "promote", "Promoted"
        AUTO = "auto", "Promoted automatically"
        ROLLBACK = "rollback", "Rolled back"
        DEMOTE = "demote", "Demoted (no active model)"

    action = models.CharField(max_length=10, choices=Action.choices)
    from_model = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="promotions_from"
    )
    to_model = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="promotions_to"
    )
    by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    forced = models.BooleanField(default=False, help_text="Promoted although its endpoint did not answer.")
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.get_action_display()}: {self.from_model or '—'} → {self.to_model or '—'}"


class Stage(models.TextChoices):
    """The stages of an iteration, in the order they run (UI-TARS-2 §2.3-2.6)."""

    RFT = "rft", "Rejection sampling (RFT)"
    VALIDATE = "validate", "Validation and routing"
    EXPORT = "export", "Export to the SFT/CT stores"
    CT = "ct", "Continual pre-training"
    SFT = "sft", "Supervised fine-tuning"
    VALUE = "value", "Value pretraining"
    PPO = "ppo", "PPO on verifiable tasks"
    EVALUATE = "evaluate", "Evaluation"


# What this build can run: every stage (start_iteration refuses combinations that cannot run, saying why).
AVAILABLE_STAGES = tuple(Stage)


class Iteration(models.Model):
    """One turn of the flywheel, started by an ML engineer: its scope, its stages and their progress.

    `config` holds the validation function's weights, thresholds and rules as they were when it ran (see
    flywheel.validation.VConfig); `stages` holds, per selected stage, {status, done, total, started_at, finished_at,
    output}. Stages are idempotent: a stage marked done is skipped when the iteration is resumed."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    class Scope(models.TextChoices):
        NEW = "new", "New since the last iteration (not yet in a store)"
        ALL = "all", "Every finished trajectory"

    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="iterations"
    )
    base_model = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="iterations"
    )
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.NEW)
    modes = models.JSONField(default=list, blank=True, help_text="Trajectory modes in scope; empty: all.")
    domains = models.JSONField(default=list, blank=True, help_text="Task domains in scope; empty: all.")
    date_from = models.DateTimeField(null=True, blank=True, help_text="Submitted (or created) at or after.")
    date_to = models.DateTimeField(null=True, blank=True, help_text="Submitted (or created) before.")
    scope_until = models.DateTimeField(
        null=True, blank=True, help_text="Set when it starts: trajectories submitted later wait for the next one."
    )
    selected_stages = models.JSONField(default=list, help_text="Stage names to run, in Stage order.")
    config = models.JSONField(default=dict, blank=True, help_text="V weights, threshold, rules, export options.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    current_stage = models.CharField(max_length=10, choices=Stage.choices, blank=True)
    stages = models.JSONField(default=dict, blank=True, help_text="Per stage: status, done, total, times, output.")
    cancel_requested = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"iteration {self.pk} ({self.status})"

    @property
    def finished(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FAILED, self.Status.CANCELLED)


class Route(models.TextChoices):
    SFT = "sft", "SFT store"
    CT = "ct", "CT store"
    HELD = "held", "Held back"


class Validation(models.Model):
    """V(s) of one trajectory in one iteration, its components and where it was routed (and why)."""

    # No index of its own: the (iteration, trajectory) unique constraint leads with it.
    iteration = models.ForeignKey(Iteration, on_delete=models.CASCADE, related_name="validations", db_index=False)
    trajectory = models.ForeignKey("annotation_app.Trajectory", on_delete=models.CASCADE, related_name="validations")
    v = models.FloatField(help_text="The validation score, 0..1.")
    components = models.JSONField(default=dict, help_text="{name: {value, source}} of each signal that counted.")
    route = models.CharField(max_length=4, choices=Route.choices)
    reason = models.TextField()
    threshold = models.FloatField(help_text="The SFT threshold V was compared with.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["iteration_id", "trajectory_id"]
        constraints = [
            models.UniqueConstraint(fields=["iteration", "trajectory"], name="one_validation_per_iteration"),
            models.CheckConstraint(condition=Q(v__gte=0.0, v__lte=1.0), name="validation_v_0_1"),
        ]
        indexes = [models.Index(fields=["iteration", "route"])]

    def __str__(self) -> str:
        return f"V={self.v:.2f} → {self.route} (trajectory {self.trajectory_id}, iteration {self.iteration_id})"


class DatasetVersion(models.Model):
    """An immutable version of the SFT or CT store: its parent's rows plus the rows it adds (by reference: the
    parent's files are listed in the manifest, never copied). Files live in Django storage under
    `flywheel/stores/<kind>/`; `manifest` lists every file with its SHA-256 (see docs/flywheel.md)."""

    class Kind(models.TextChoices):
        SFT = "sft", "SFT"
        CT = "ct", "CT"

    kind = models.CharField(max_length=4, choices=Kind.choices)
    number = models.PositiveIntegerField(help_text="1, 2, … within its kind.")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    iteration = models.ForeignKey(
        Iteration, null=True, blank=True, on_delete=models.SET_NULL, related_name="dataset_versions"
    )
    manifest = models.JSONField(default=dict)
    row_count = models.PositiveIntegerField(default=0, help_text="Rows in this version, the parent's included.")
    added_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["kind", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "number"], name="one_dataset_version_number"),
            models.UniqueConstraint(fields=["iteration", "kind"], name="one_dataset_version_per_iteration"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} v{self.number}"

    @property
    def label(self) -> str:
        return f"{self.get_kind_display()} v{self.number}"
