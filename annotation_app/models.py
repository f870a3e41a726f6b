"""The annotation domain's tables: users with roles, tasks, assignments, trajectories, steps, recordings, reviews.

Binary payloads (screenshots, audio, raw event logs) live in Django storage; rows hold their paths and checksums.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models
from django.db.models import Q


class Role(models.TextChoices):
    ANNOTATOR = "annotator", "Annotator"
    DATA_LEAD = "data_lead", "Data lead"
    ML_ENGINEER = "ml_engineer", "ML engineer"


class User(AbstractUser):
    """A person using the platform; `role` decides what they may see and do (see annotation_app.permissions)."""

    role = models.CharField(max_length=20, choices=Role.choices, default=Role.ANNOTATOR)
    is_simulated = models.BooleanField(
        default=False, help_text="A program, not a person (the flywheel demonstration's simulated annotators)."
    )


class Task(models.Model):
    """Something to do on a computer, phone or browser: an instruction plus optional OSWorld-style setup/evaluator."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        ASSIGNED = "assigned", "Assigned"
        COMPLETED = "completed", "Completed"
        ARCHIVED = "archived", "Archived"

    class Platform(models.TextChoices):
        DESKTOP = "desktop", "Desktop"
        BROWSER = "browser", "Browser"
        MOBILE = "mobile", "Mobile"
        GAME = "game", "Game"

    external_id = models.CharField(
        max_length=200, unique=True, null=True, blank=True, help_text="Id in the source dataset (e.g. OSWorld uuid)."
    )
    instruction = models.TextField()
    platform = models.CharField(max_length=20, choices=Platform.choices, default=Platform.DESKTOP)
    domain = models.CharField(max_length=100, blank=True, help_text="App or domain, e.g. chrome, libreoffice_calc.")
    related_apps = models.JSONField(default=list, blank=True)
    difficulty = models.PositiveSmallIntegerField(default=3, help_text="1 (trivial) to 5 (expert).")
    importance = models.SmallIntegerField(default=0, help_text="Higher is handed out first.")
    setup_config = models.JSONField(default=list, blank=True, help_text="OSWorld `config`: [{type, parameters}].")
    evaluator = models.JSONField(default=dict, blank=True, help_text="OSWorld `evaluator`: {func, result, expected}.")
    metadata = models.JSONField(default=dict, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    project = models.CharField(
        max_length=100, blank=True, default="", db_index=True, help_text="Groups tasks under one ProjectSettings."
    )
    required_annotations = models.PositiveSmallIntegerField(
        default=1, help_text="k: how many different annotators must each submit a trajectory (dual annotation)."
    )
    is_gold = models.BooleanField(
        default=False, help_text="Known verifier and answer; mixed into queues to measure annotators' accuracy."
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-importance", "id"]
        indexes = [
            # The queue's hot query: the most important pending task first.
            models.Index(models.F("importance").desc(), "id", name="task_queue_idx", condition=Q(status="pending")),
            models.Index(fields=["domain"]),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(difficulty__gte=1, difficulty__lte=5), name="task_difficulty_1_5"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.instruction[:60]}"


class Assignment(models.Model):
    """One annotator holding one task. A task is held by at most `required_annotations` annotators at once (the
    queue's transaction sees to that) and by one annotator at most once at a time (the database sees to that)."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        COMPLETED = "completed", "Completed"
        SKIPPED = "skipped", "Skipped"
        UNSKIPPED = "unskipped", "Skipped, then un-skipped"  # the queue may hand the task to them again
        EXPIRED = "expired", "Expired"

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="assignments")
    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="assignments")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.ACTIVE)
    assigned_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["task", "annotator"], condition=Q(status="active"), name="one_active_assignment_per_annotator"
            ),
        ]
        indexes = [models.Index(fields=["annotator", "status"])]

    def __str__(self) -> str:
        return f"{self.annotator} → task {self.task_id} ({self.status})"


class TrajectoryQuerySet(models.QuerySet):
    def with_step_count(self) -> TrajectoryQuerySet:
        """Annotate `step_count` with a correlated subquery: PostgreSQL runs it only for the rows a LIMIT keeps,
        where a JOIN + GROUP BY would count the steps of every matching trajectory first."""
        steps = Step.objects.filter(trajectory=models.OuterRef("pk")).order_by().values("trajectory")
        return self.annotate(
            step_count=models.Subquery(
                steps.annotate(n=models.Count("*")).values("n"), output_field=models.IntegerField()
            )
        )


class Trajectory(models.Model):
    """One attempt at a task: by an annotator (in-situ or interactive with model proposals) or by the model alone."""

    class Mode(models.TextChoices):
        IN_SITU = "in_situ", "In-situ think-aloud"
        INTERACTIVE = "interactive", "Interactive (model proposes)"
        ROLLOUT = "rollout", "Model rollout"

    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress", "In progress"
        SUBMITTED = "submitted", "Submitted"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        ABANDONED = "abandoned", "Abandoned"  # ended without being submitted (metadata.end_reason says how)

    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="trajectories")
    annotator = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="trajectories"
    )
    mode = models.CharField(max_length=20, choices=Mode.choices)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.IN_PROGRESS)
    model_version = models.ForeignKey(
        "flywheel.ModelVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="trajectories",
        help_text="The model that proposed actions (interactive) or acted (rollout).",
    )
    screen_width = models.PositiveIntegerField(default=1920)
    screen_height = models.PositiveIntegerField(default=1080)
    outcome_reward = models.FloatField(null=True, blank=True, help_text="Evaluator result, 0..1, when known.")
    simulated = models.BooleanField(default=False, help_text="Made by a simulated annotator, not a person.")
    flags = models.JSONField(
        default=list,
        blank=True,
        help_text="Curation flags [{kind, detail, at}]: not_executable, divergent_steps, near_duplicate…",
    )
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    submitted_at = models.DateTimeField(null=True, blank=True)

    objects = TrajectoryQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "trajectories"
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "-created_at"]),
            models.Index(fields=["annotator", "-created_at"]),
        ]

    def __str__(self) -> str:
        return f"trajectory {self.pk} of task {self.task_id} ({self.mode}, {self.status})"


def step_screenshot_path(step: Step, filename: str) -> str:
    ext = filename.rsplit(".", 1)[-1].lower() if "." in filename else "bin"
    return f"trajectories/{step.trajectory_id}/steps/{step.index:05d}.{ext}"


def recording_path(recording: Recording, filename: str) -> str:
    return f"trajectories/{recording.trajectory_id}/recordings/{filename}"


class Step(models.Model):
    """One observation → thought → action turn of a trajectory.

    Every step's action (`action_text`, `action`, and the points of its `candidates`) is in screen pixels of the
    trajectory's `screen_width` x `screen_height`, whatever the screenshot's size and however the step was made.
    Model frames (smart-resized, relative 0-1000) exist only at the model boundary (sandbox.coordinates)."""

    class Source(models.TextChoices):
        MODEL = "model", "Model (accepted)"
        HUMAN = "human", "Human"

    class Status(models.TextChoices):
        EXECUTING = "executing", "Executing"  # stored before its action was sent to the sandbox
        DONE = "done", "Done"  # the action ran and its result was recorded
        FAILED = "failed", "Failed"  # sent, but its result was never recorded: the desktop may have run it
        CUT = "cut", "Cut by a reviewer"  # kept for its history, left out of exports and validation

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveIntegerField()
    screenshot = models.FileField(upload_to=step_screenshot_path, blank=True)
    screenshot_sha256 = models.CharField(max_length=64, blank=True)
    thought = models.TextField(blank=True)
    action_text = models.TextField(
        help_text="Canonical UI-TARS action text in screen pixels, e.g. click(start_box='(10,20)')."
    )
    action = models.JSONField(default=dict, blank=True, help_text="The parsed, typed form of action_text.")
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.HUMAN)
    status = models.CharField(
        max_length=10,
        choices=Status.choices,
        default=Status.DONE,
        help_text="Live steps are stored 'executing' before their action runs, so the stored steps never fall behind "
        "the desktop; 'failed' when the result could not be recorded.",
    )
    error = models.TextField(blank=True, help_text="Why a failed step's result was not recorded.")
    candidates = models.JSONField(
        default=list,
        blank=True,
        help_text="Model proposals shown for this step (annotation_app.candidates), in screen pixels: "
        "[{thought, action_text, actions, points, raw, error, model}].",
    )
    chosen_candidate = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Index into candidates of the accepted proposal; empty when overridden."
    )
    model_version = models.ForeignKey(
        "flywheel.ModelVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="steps",
        help_text="The model that proposed this step's candidates.",
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    model_latency_ms = models.PositiveIntegerField(null=True, blank=True)
    settle = models.JSONField(
        default=dict,
        blank=True,
        help_text="How long the screenshot waited for the screen to settle after the previous action or the setup "
        "(sandbox.settle): {waited_ms, timed_out, redraws}; empty where not measured.",
    )
    outline = models.JSONField(
        null=True,
        blank=True,
        help_text="A browser page's interactive elements when the screenshot was taken (sandbox/outline.py: role, "
        "text, value, state, box in screen pixels), which the model read beside it; null where there was none.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["trajectory_id", "index"]
        constraints = [models.UniqueConstraint(fields=["trajectory", "index"], name="unique_step_index")]

    def __str__(self) -> str:
        return f"step {self.index} of trajectory {self.trajectory_id}"


class Recording(models.Model):
    """In-situ capture material for a trajectory: the think-aloud audio and the raw input-event log."""

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="recordings")
    audio = models.FileField(upload_to=recording_path, blank=True)
    audio_sha256 = models.CharField(max_length=64, blank=True)
    audio_content_type = models.CharField(max_length=50, blank=True)
    events = models.FileField(upload_to=recording_path, blank=True, help_text="Raw input events, JSON Lines.")
    events_sha256 = models.CharField(max_length=64, blank=True)
    event_count = models.PositiveIntegerField(default=0)
    duration_s = models.FloatField(null=True, blank=True)
    transcript = models.JSONField(default=list, blank=True, help_text="ASR segments [{start, end, text}].")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"recording {self.pk} of trajectory {self.trajectory_id}"


class Review(models.Model):
    """A data lead's verdict on a submitted trajectory."""

    class Verdict(models.TextChoices):
        APPROVE = "approve", "Approve"
        REJECT = "reject", "Reject"

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reviews")
    verdict = models.CharField(max_length=10, choices=Verdict.choices)
    score = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Quality 1..5, optional.")
    scores = models.JSONField(
        default=dict, blank=True, help_text="Rubric scores {criterion key: value}, per the project's rubric."
    )
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(score__isnull=True) | Q(score__gte=1, score__lte=5), name="review_score_1_5"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.verdict} of trajectory {self.trajectory_id} by {self.reviewer}"


def live_observation_path(live: LiveSession, filename: str) -> str:
    return f"trajectories/{live.trajectory_id}/live/{filename}"


class LiveSession(models.Model):
    """The live side of an interactive trajectory: its sandbox lease, the screen the model sees now, and the
    proposals for the next step. Steps themselves are stored as they happen, so nothing here is needed to keep them."""

    class Status(models.TextChoices):
        STARTING = "starting", "Starting"
        ACTIVE = "active", "Active"
        ENDED = "ended", "Ended"
        FAILED = "failed", "Failed"

    class Proposals(models.TextChoices):
        NONE = "none", "None"
        PENDING = "pending", "Pending"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    trajectory = models.OneToOneField(Trajectory, on_delete=models.CASCADE, related_name="live")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.STARTING)
    kind = models.CharField(max_length=10, default="desktop", help_text="Sandbox kind: desktop or browser.")
    sandbox_session_id = models.CharField(max_length=64, blank=True)
    model_width = models.PositiveIntegerField(
        default=0, help_text="Size of the image the model sees; proposals and overrides are in its frame."
    )
    model_height = models.PositiveIntegerField(default=0)
    observation = models.FileField(upload_to=live_observation_path, blank=True)
    next_index = models.PositiveIntegerField(default=0)
    proposals = models.CharField(max_length=10, choices=Proposals.choices, default=Proposals.NONE)
    candidates = models.JSONField(
        default=list, blank=True, help_text="The proposals for the next step (annotation_app.candidates), model frame."
    )
    proposal_error = models.TextField(blank=True)
    proposal_latency_ms = models.PositiveIntegerField(null=True, blank=True)
    proposal_seed = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Makes the sampled proposals reproducible: step i's request is seeded from it and i.",
    )
    observation_outline = models.JSONField(
        null=True,
        blank=True,
        help_text="The current observation's page outline (sandbox/outline.py, screen pixels), as the proposals were "
        "asked with it; the step taken on this observation stores it.",
    )
    proposals_ready_at = models.DateTimeField(null=True, blank=True)
    observation_settle = models.JSONField(
        default=dict, blank=True, help_text="The current observation's wait for the screen to settle (sandbox.settle)."
    )
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    end_reason = models.CharField(max_length=20, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"live session of trajectory {self.trajectory_id} ({self.status})"

    @property
    def open(self) -> bool:
        return self.status in (self.Status.STARTING, self.Status.ACTIVE)


class Capture(models.Model):
    """A think-aloud session (UI-TARS-2 §2.4.1): uploaded in resumable chunks by the recorder, or recorded in the
    browser, then unpacked, transcribed, reduced to actions and aligned into an in-situ trajectory."""

    class Source(models.TextChoices):
        RECORDER = "recorder", "Recorder"
        BROWSER = "browser", "Browser"

    class Status(models.TextChoices):
        RECORDING = "recording", "Recording"  # in the browser, on a sandbox desktop
        RECEIVING = "receiving", "Receiving"  # chunks still arriving
        VERIFYING = "verifying", "Verifying"  # every byte arrived; the whole file's SHA-256 is being checked
        QUEUED = "queued", "Queued"
        PROCESSING = "processing", "Processing"
        READY = "ready", "Ready for review"  # the annotator checks and fixes the timeline
        SUBMITTED = "submitted", "Submitted"
        FAILED = "failed", "Failed"

    # The stages of a browser capture before *Record*: a Celery task leases its sandbox desktop and runs the setup.
    STAGE_STARTING = "starting the desktop"
    STAGE_READY = "ready to record"

    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="captures")
    session_id = models.UUIDField(help_text="Chosen by the recorder; uploads are idempotent on it.")
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.RECORDER)
    task = models.ForeignKey(
        Task, null=True, blank=True, on_delete=models.SET_NULL, related_name="captures", help_text="Empty: free-form."
    )
    instruction = models.TextField(blank=True)
    size = models.PositiveBigIntegerField(help_text="Bytes of the whole archive.")
    sha256 = models.CharField(max_length=64)
    received = models.PositiveBigIntegerField(default=0, help_text="Bytes stored so far (the resume offset).")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.RECEIVING)
    stage = models.CharField(max_length=40, blank=True, help_text="What processing is doing now.")
    progress = models.FloatField(default=0.0, help_text="0..1 through processing.")
    error = models.TextField(blank=True)
    trajectory = models.OneToOneField(
        Trajectory, null=True, blank=True, on_delete=models.SET_NULL, related_name="capture"
    )
    meta = models.JSONField(default=dict, blank=True, help_text="The capture's session.json.")
    transcript = models.JSONField(default=dict, blank=True, help_text="ASR output: words with times, segments.")
    alignment = models.JSONField(
        default=list, blank=True, help_text="Per step: the spoken words (capture clock) and the raw transcript text."
    )
    warnings = models.JSONField(default=list, blank=True)
    flags = models.JSONField(default=list, blank=True, help_text="Curation: too_short, no_speech, near_duplicate…")
    signature = models.JSONField(default=dict, blank=True, help_text="Screen hashes and action sequence, for dedup.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["annotator", "session_id"], name="one_capture_per_session"),
        ]

    def __str__(self) -> str:
        return f"capture {self.pk} by {self.annotator_id} ({self.status})"

    @property
    def pending(self) -> bool:
        """Something is under way that the capture's page waits for (and polls): the upload, its verification,
        processing, or (in the browser) the sandbox desktop starting."""
        if self.status == self.Status.RECORDING:
            return self.stage == self.STAGE_STARTING
        return self.status in (self.Status.RECEIVING, self.Status.VERIFYING, self.Status.QUEUED, self.Status.PROCESSING)

    @property
    def archive_path(self) -> str:
        """Where the uploaded archive lives in storage (relative to MEDIA_ROOT)."""
        return f"captures/{self.pk}/capture.tar"


class ProjectSettings(models.Model):
    """A data lead's per-project review configuration: the rubric, the review sampling policy and the gold rate.
    Tasks name their project in `Task.project`; the empty name is the default project."""

    project = models.CharField(max_length=100, unique=True, blank=True, default="")
    rubric = models.JSONField(
        default=list,
        blank=True,
        help_text="Criteria [{key, label, min, max}], e.g. task_completed, efficient, thoughts_explain_actions (1-5).",
    )
    review_first_n = models.PositiveIntegerField(
        default=5, help_text="Review every one of a new annotator's first N submitted trajectories."
    )
    review_share = models.FloatField(default=0.2, help_text="Share of later trajectories sampled for review, 0..1.")
    gold_rate = models.FloatField(default=0.1, help_text="Share of queue hand-outs that are gold tasks, 0..1.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "project settings"
        constraints = [
            models.CheckConstraint(
                condition=Q(review_share__gte=0, review_share__lte=1, gold_rate__gte=0, gold_rate__lte=1),
                name="project_settings_shares_0_1",
            ),
        ]

    def __str__(self) -> str:
        return f"settings of project {self.project or '(default)'}"


class StepVerdict(models.Model):
    """A reviewer's verdict on one step; one per (step, reviewer), the latest wins."""

    class Verdict(models.TextChoices):
        OK = "ok", "OK"
        WRONG_ACTION = "wrong_action", "Wrong action"
        WRONG_THOUGHT = "wrong_thought", "Wrong thought"
        BAD_SCREENSHOT = "bad_screenshot", "Bad screenshot"

    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="verdicts")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="step_verdicts")
    verdict = models.CharField(max_length=20, choices=Verdict.choices)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["step", "reviewer"], name="one_verdict_per_step_reviewer")]

    def __str__(self) -> str:
        return f"{self.verdict} on step {self.step_id} by {self.reviewer}"


class StepEdit(models.Model):
    """One change a reviewer made to a step (its thought, its action, or a cut); the step holds the edited value,
    so the history of edits keeps every original."""

    class Field(models.TextChoices):
        THOUGHT = "thought", "Thought"
        ACTION = "action", "Action"
        STATUS = "status", "Status (cut or restored)"

    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="edits")
    editor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="step_edits")
    field = models.CharField(max_length=10, choices=Field.choices)
    before = models.TextField(blank=True)
    after = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step_id", "created_at", "id"]

    def __str__(self) -> str:
        return f"{self.field} of step {self.step_id} by {self.editor}"


class ReviewAssignment(models.Model):
    """A trajectory handed to a reviewer from the review queue; never to the trajectory's own annotator."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        DONE = "done", "Done"
        RELEASED = "released", "Released"

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="review_assignments")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="review_assignments")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE)
    reason = models.CharField(max_length=40, blank=True, help_text="Why it was queued: new_annotator, sampled…")
    assigned_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["trajectory"], condition=Q(status="active"), name="one_active_review_per_trajectory"
            ),
        ]
        indexes = [models.Index(fields=["reviewer", "status"])]

    def __str__(self) -> str:
        return f"review of trajectory {self.trajectory_id} by {self.reviewer} ({self.status})"


class Adjudication(models.Model):
    """A data lead's decision between disagreeing annotations of one task: the trajectory that stands, or none."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="adjudications")
    lead = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="adjudications")
    chosen = models.ForeignKey(
        Trajectory, null=True, blank=True, on_delete=models.SET_NULL, related_name="adjudications_won"
    )
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"adjudication of task {self.task_id}: {self.chosen_id or 'neither'}"
