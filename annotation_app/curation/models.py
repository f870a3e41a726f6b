"""Curation's tables: executability runs (a trajectory replayed in a fresh sandbox), near-duplicate groups, and each
trajectory's signature (action skeleton + perceptual hashes) that the deduplication indexes."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class VerificationRun(models.Model):
    """One replay of a trajectory's actions from its task's setup, with each step's screenshot compared to the
    recorded one and the evaluator run at the end. The latest finished run sets the trajectory's flags."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        PASSED = "passed", "Passed"  # every step ran, no divergent step, the evaluator agrees
        FLAGGED = "flagged", "Flagged"  # not executable and/or divergent steps
        ERROR = "error", "Error"  # the replay could not be judged (sandbox unreachable, no setup…): no flag set

    ACTIVE = (Status.QUEUED, Status.RUNNING)

    trajectory = models.ForeignKey(
        "annotation_app.Trajectory", on_delete=models.CASCADE, related_name="verification_runs"
    )
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    threshold = models.PositiveSmallIntegerField(help_text="Largest perceptual-hash distance (bits of 64) still equal.")
    distances = models.JSONField(
        default=list, blank=True, help_text="Per replayed step: {index, distance}; distance null without a screenshot."
    )
    divergent_steps = models.JSONField(default=list, blank=True, help_text="Step indices past the threshold.")
    executable = models.BooleanField(null=True, blank=True, help_text="Null until judged (or on error).")
    evaluator_score = models.FloatField(null=True, blank=True)
    expected_score = models.FloatField(null=True, blank=True, help_text="What the recording should score.")
    errors = models.JSONField(default=list, blank=True, help_text="What went wrong, in words.")
    timings = models.JSONField(default=dict, blank=True, help_text="Milliseconds: allocate, setup, steps, evaluate.")
    session_id = models.CharField(max_length=64, blank=True, help_text="The sandbox session (released at the end).")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["trajectory", "-created_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["trajectory"], condition=Q(status__in=["queued", "running"]), name="one_active_verification"
            ),
        ]

    def __str__(self) -> str:
        return f"verification {self.pk} of trajectory {self.trajectory_id} ({self.status})"

    @property
    def active(self) -> bool:
        return self.status in self.ACTIVE


class DuplicateGroup(models.Model):
    """Near-duplicate trajectories of one task; `kept` is the one the flywheel keeps for SFT."""

    task = models.ForeignKey("annotation_app.Task", on_delete=models.CASCADE, related_name="duplicate_groups")
    kept = models.ForeignKey(
        "annotation_app.Trajectory", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]

    def __str__(self) -> str:
        return f"duplicate group {self.pk} of task {self.task_id}"


class TrajectorySignature(models.Model):
    """What deduplication compares: the action skeleton's key (indexed with the task, so candidates are one index
    lookup), each step's normalised points and each step's screenshot perceptual hash."""

    trajectory = models.OneToOneField(
        "annotation_app.Trajectory", on_delete=models.CASCADE, primary_key=True, related_name="signature"
    )
    task = models.ForeignKey("annotation_app.Task", on_delete=models.CASCADE, related_name="+")
    action_key = models.CharField(max_length=64, help_text="sha256 of the action types and their non-point args.")
    points = models.JSONField(default=list, help_text="Per step, its actions' points as fractions of the screen.")
    hashes = models.JSONField(default=list, help_text="Per step, the screenshot's 64-bit pHash (hex); '' if none.")
    digest = models.CharField(max_length=64, help_text="sha256 of the steps' actions and screenshot checksums.")
    group = models.ForeignKey(DuplicateGroup, null=True, blank=True, on_delete=models.SET_NULL, related_name="members")
    computed_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["task", "action_key"])]

    def __str__(self) -> str:
        return f"signature of trajectory {self.trajectory_id}"
