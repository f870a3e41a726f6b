"""Precomputed quality aggregates: each refresh replaces every row in one transaction, so the dashboard reads a few
hundred small rows instead of counting the task, trajectory and step tables on every load."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Refresh(models.Model):
    """One recomputation of the aggregates; the newest finished one is the dashboard's "as of"."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    trigger = models.CharField(max_length=10, default="beat", help_text="beat, button or command.")
    started_at = models.DateTimeField()
    as_of = models.DateTimeField(null=True, blank=True, help_text="The moment the data was read (the snapshot).")
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    # The review backlog, at `as_of`.
    backlog_unreviewed = models.PositiveIntegerField(default=0, help_text="Submitted trajectories with no review.")
    backlog_assigned = models.PositiveIntegerField(default=0, help_text="Of those, held by a reviewer now.")
    backlog_oldest = models.DateTimeField(null=True, blank=True, help_text="Submission time of the oldest unreviewed.")

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"quality refresh {self.pk} ({self.status})"


class AnnotatorStats(models.Model):
    """One annotator's throughput and quality figures over all their work."""

    annotator = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    username = models.CharField(max_length=150)
    trajectories = models.PositiveIntegerField(default=0, help_text="Submitted (incl. reviewed) trajectories.")
    steps = models.PositiveIntegerField(default=0, help_text="Steps of all their trajectories.")
    active_hours = models.PositiveIntegerField(default=0, help_text="Clock hours with a step or a submission.")
    active_days = models.PositiveIntegerField(default=0, help_text="Days with a step or a submission.")
    median_step_s = models.FloatField(null=True, blank=True, help_text="Median seconds per step, where timed.")
    reviewed = models.PositiveIntegerField(default=0, help_text="Trajectories with a review (the latest counts).")
    passed = models.PositiveIntegerField(default=0, help_text="Of those, approved.")
    gold_scored = models.PositiveIntegerField(default=0, help_text="Gold-task trajectories with a verifier result.")
    gold_reward_sum = models.FloatField(default=0, help_text="Sum of their verifier rewards (0..1 each).")
    peer_pairs = models.PositiveIntegerField(default=0, help_text="Pairs with a peer on the same task, both judged.")
    peer_agreed = models.PositiveIntegerField(default=0)
    # From annotation_app.agreement (pairs of annotators on the same task), each a mean over their peers' shared tasks.
    peer_tasks = models.PositiveIntegerField(default=0, help_text="Tasks shared with a peer (summed over peers).")
    peer_outcome = models.FloatField(null=True, blank=True, help_text="Share of shared tasks with the same outcome.")
    peer_first_step = models.FloatField(null=True, blank=True, help_text="Share whose first actions agree.")
    peer_similarity = models.FloatField(null=True, blank=True, help_text="Mean action-sequence similarity, 0..1.")

    class Meta:
        ordering = ["username"]

    def __str__(self) -> str:
        return f"quality of {self.username}"

    @staticmethod
    def _ratio(part: int, whole: int) -> float | None:
        return part / whole if whole else None

    @property
    def trajectories_per_hour(self) -> float | None:
        return self._ratio(self.trajectories, self.active_hours)

    @property
    def trajectories_per_day(self) -> float | None:
        return self._ratio(self.trajectories, self.active_days)

    @property
    def steps_per_hour(self) -> float | None:
        return self._ratio(self.steps, self.active_hours)

    @property
    def steps_per_day(self) -> float | None:
        return self._ratio(self.steps, self.active_days)

    @property
    def pass_rate(self) -> float | None:
        return self._ratio(self.passed, self.reviewed)

    @property
    def gold_accuracy(self) -> float | None:
        return self.gold_reward_sum / self.gold_scored if self.gold_scored else None

    @property
    def peer_agreement(self) -> float | None:
        return self._ratio(self.peer_agreed, self.peer_pairs)


class Throughput(models.Model):
    """Trajectories submitted and steps made in one day by one annotator (empty annotator: everyone)."""

    annotator = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    day = models.DateField()
    trajectories = models.PositiveIntegerField(default=0)
    steps = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["day"]
        indexes = [models.Index(fields=["annotator", "day"])]

    def __str__(self) -> str:
        return f"throughput of {self.annotator_id or 'everyone'} on {self.day}"


class ModelAcceptance(models.Model):
    """How annotators took one model version's proposals, per proposed action type (empty type: all types)."""

    model_version = models.ForeignKey("flywheel.ModelVersion", on_delete=models.CASCADE, related_name="+")
    model_name = models.CharField(max_length=100)
    model_created_at = models.DateTimeField()
    action_type = models.CharField(max_length=40, blank=True)
    proposals = models.PositiveIntegerField(default=0, help_text="Steps that showed this model's candidates.")
    accepted = models.PositiveIntegerField(default=0, help_text="A candidate chosen and run as proposed.")
    edited = models.PositiveIntegerField(default=0, help_text="A candidate chosen, then its action changed.")
    overridden = models.PositiveIntegerField(default=0, help_text="No candidate chosen: the annotator wrote one.")

    class Meta:
        ordering = ["model_created_at", "model_version_id", "action_type"]

    def __str__(self) -> str:
        return f"acceptance of {self.model_name} ({self.action_type or 'all'})"

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.proposals if self.proposals else None

    @property
    def edited_rate(self) -> float | None:
        return self.edited / self.proposals if self.proposals else None

    @property
    def overridden_rate(self) -> float | None:
        return self.overridden / self.proposals if self.proposals else None


class Coverage(models.Model):
    """How many tasks (or trajectories) fall under one value of one dimension."""

    class Dimension(models.TextChoices):
        DOMAIN = "domain", "Tasks by domain"
        PLATFORM = "platform", "Tasks by platform"
        DIFFICULTY = "difficulty", "Tasks by difficulty"
        TRAJECTORY_STATUS = "trajectory_status", "Trajectories by status"

    dimension = models.CharField(max_length=20, choices=Dimension.choices)
    key = models.CharField(max_length=100, blank=True)
    count = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0, help_text="Tasks only: how many of them are completed.")

    class Meta:
        ordering = ["dimension", "key"]

    def __str__(self) -> str:
        return f"{self.dimension} {self.key}: {self.count}"
