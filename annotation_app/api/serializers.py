"""API representations. Writable serializers reject fields they don't know instead of silently dropping them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import serializers

from flywheel.models import ModelVersion
from sandbox.actions import ActionSyntaxError, parse_actions

from ..candidates import CandidateError, check_candidates
from ..models import Assignment, Recording, Review, Step, Task, Trajectory
from ..task_import import check_evaluator, check_setup_config
from ..trajectories import typed_action


def _checked(check: Callable[..., Any], value: Any, *args: str) -> Any:
    """Run one of task_import's field checks and turn its problems into a DRF validation error."""
    problems: list[str] = []
    check(value, *args, problems)
    if problems:
        raise serializers.ValidationError([p.replace("|", ": ", 1) for p in problems])
    return value


class StrictSerializerMixin:
    """Unknown input fields are an error ("unknown field(s): x"), so typos never pass unnoticed."""

    def to_internal_value(self, data: Any) -> Any:
        if hasattr(data, "keys"):
            writable = {name for name, f in self.fields.items() if not f.read_only}  # type: ignore[attr-defined]
            unknown = sorted(set(data.keys()) - writable)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)  # type: ignore[misc]


class TaskSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    parent = serializers.PrimaryKeyRelatedField(queryset=Task.objects.all(), allow_null=True, required=False)

    class Meta:
        model = Task
        fields = [
            "id",
            "external_id",
            "instruction",
            "platform",
            "domain",
            "related_apps",
            "difficulty",
            "importance",
            "setup_config",
            "evaluator",
            "metadata",
            "parent",
            "status",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate_status(self, value: str) -> str:
        """Data leads archive tasks or bring them back; the queue alone assigns and completes them."""
        current = self.instance.status if self.instance is not None else None
        if value == current:
            return value
        if value not in (Task.Status.PENDING, Task.Status.ARCHIVED):
            raise serializers.ValidationError("Only 'pending' and 'archived' can be set; the queue does the rest.")
        if current in (Task.Status.ASSIGNED, Task.Status.COMPLETED):
            raise serializers.ValidationError(f"The task is {current}; it can't be moved to {value}.")
        return value

    def validate_difficulty(self, value: int) -> int:
        if not 1 <= value <= 5:
            raise serializers.ValidationError("Difficulty runs from 1 (trivial) to 5 (expert).")
        return value

    # The same checks as task import, so a task is valid or not whichever way it arrives.
    def validate_setup_config(self, value: Any) -> list:
        return _checked(check_setup_config, value, "setup_config")

    def validate_evaluator(self, value: Any) -> dict:
        return _checked(check_evaluator, value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        parent = attrs.get("parent")
        if parent is not None and self.instance is not None:
            node: Task | None = parent
            while node is not None:
                if node.pk == self.instance.pk:
                    raise serializers.ValidationError({"parent": ["A task can't be its own ancestor."]})
                node = node.parent
        return attrs


class TaskImportSerializer(serializers.Serializer):
    file = serializers.FileField(
        help_text="JSON (object, list, or {tasks: [...]}) or JSON Lines; OSWorld task files work."
    )
    on_conflict = serializers.ChoiceField(choices=["error", "skip"], default="error")


class TaskImportResultSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    skipped = serializers.IntegerField()


class AssignmentSerializer(serializers.ModelSerializer):
    task = TaskSerializer(read_only=True)

    class Meta:
        model = Assignment
        fields = ["id", "task", "status", "assigned_at"]


class NextTaskRequestSerializer(StrictSerializerMixin, serializers.Serializer):
    skip_current = serializers.BooleanField(
        default=False, help_text="Hand the current task back (you won't get it again) and take the next one."
    )


class StepSerializer(serializers.ModelSerializer):
    screenshot_url = serializers.SerializerMethodField()

    class Meta:
        model = Step
        fields = [
            "id",
            "index",
            "thought",
            "action_text",
            "action",
            "source",
            "status",
            "error",
            "candidates",
            "screenshot_url",
            "screenshot_sha256",
            "started_at",
            "finished_at",
            "model_latency_ms",
            "created_at",
        ]

    def get_screenshot_url(self, step: Step) -> str | None:
        return step.screenshot.url if step.screenshot else None


class StepCreateSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    index = serializers.IntegerField(min_value=0, required=False, help_text="Must be the next index when given.")
    screenshot = serializers.FileField(required=False, help_text="PNG, JPEG or WebP of the screen before the action.")
    screenshot_sha256 = serializers.RegexField(r"^[0-9a-fA-F]{64}$", required=False)

    class Meta:
        model = Step
        fields = [
            "index",
            "thought",
            "action_text",
            "source",
            "candidates",
            "screenshot",
            "screenshot_sha256",
            "started_at",
            "finished_at",
            "model_latency_ms",
        ]

    def validate_action_text(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("The action is required, e.g. click(start_box='(100,200)').")
        try:
            parse_actions(value)
        except ActionSyntaxError as error:
            raise serializers.ValidationError(f"Not a valid UI-TARS action: {error}") from None
        return value

    def validate_candidates(self, value: Any) -> list:
        """The one candidate shape (annotation_app.candidates), in screen pixels like the step's action."""
        try:
            return check_candidates(value)
        except CandidateError as error:
            raise serializers.ValidationError(str(error)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        started, finished = attrs.get("started_at"), attrs.get("finished_at")
        if started and finished and finished < started:
            raise serializers.ValidationError({"finished_at": ["Must not be before started_at."]})
        # The typed form is derived here, from the one grammar module, never taken from the client.
        attrs["action"] = typed_action(attrs["action_text"])
        return attrs


class RecordingSerializer(serializers.ModelSerializer):
    class Meta:
        model = Recording
        fields = [
            "id",
            "audio_sha256",
            "audio_content_type",
            "events_sha256",
            "event_count",
            "duration_s",
            "transcript",
            "created_at",
        ]


class RecordingCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    audio = serializers.FileField(required=False, help_text="WAV, WebM, Ogg, FLAC or MP3 think-aloud audio.")
    audio_sha256 = serializers.RegexField(r"^[0-9a-fA-F]{64}$", required=False)
    events = serializers.FileField(required=False, help_text="Raw input events, JSON Lines with a numeric 't'.")
    events_sha256 = serializers.RegexField(r"^[0-9a-fA-F]{64}$", required=False)
    duration_s = serializers.FloatField(required=False, min_value=0)


class ReviewSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    reviewer = serializers.StringRelatedField()
    score = serializers.IntegerField(min_value=1, max_value=5, required=False, allow_null=True)

    class Meta:
        model = Review
        fields = ["id", "reviewer", "verdict", "score", "comment", "created_at"]
        read_only_fields = ["id", "reviewer", "created_at"]


class TrajectorySerializer(serializers.ModelSerializer):
    annotator = serializers.StringRelatedField()
    step_count = serializers.IntegerField(read_only=True, required=False)

    class Meta:
        model = Trajectory
        fields = [
            "id",
            "task",
            "annotator",
            "mode",
            "status",
            "model_version",
            "screen_width",
            "screen_height",
            "outcome_reward",
            "metadata",
            "created_at",
            "updated_at",
            "submitted_at",
            "step_count",
        ]


class TrajectoryDetailSerializer(TrajectorySerializer):
    steps = StepSerializer(many=True, read_only=True)
    recordings = RecordingSerializer(many=True, read_only=True)
    reviews = ReviewSerializer(many=True, read_only=True)

    class Meta(TrajectorySerializer.Meta):
        fields = [*TrajectorySerializer.Meta.fields, "steps", "recordings", "reviews"]


class TrajectoryCreateSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    task = serializers.PrimaryKeyRelatedField(queryset=Task.objects.all())
    mode = serializers.ChoiceField(
        choices=[(m.value, m.label) for m in (Trajectory.Mode.IN_SITU, Trajectory.Mode.INTERACTIVE)]
    )
    screen_width = serializers.IntegerField(min_value=64, max_value=16384, default=1920)
    screen_height = serializers.IntegerField(min_value=64, max_value=16384, default=1080)

    class Meta:
        model = Trajectory
        fields = ["task", "mode", "model_version", "screen_width", "screen_height", "metadata"]


class ModelVersionSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    class Meta:
        model = ModelVersion
        fields = [
            "id",
            "name",
            "checkpoint_uri",
            "endpoint_url",
            "served_name",
            "parent",
            "is_active",
            "metrics",
            "notes",
            "created_at",
        ]
        read_only_fields = ["id", "is_active", "created_at"]


class LiveStepSerializer(StrictSerializerMixin, serializers.Serializer):
    """Accept proposal `candidate` (0-based) or override with `thought` + `action_text`; `expected_index` guards
    against double submits."""

    expected_index = serializers.IntegerField(min_value=0)
    candidate = serializers.IntegerField(min_value=0, max_value=15, required=False, allow_null=True)
    thought = serializers.CharField(required=False, allow_blank=True, max_length=5000, trim_whitespace=False)
    action_text = serializers.CharField(required=False, allow_blank=True, max_length=5000, trim_whitespace=False)

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        accepting = data.get("candidate") is not None
        if accepting == bool(data.get("action_text", "").strip()):
            raise serializers.ValidationError("Send either 'candidate' (accept) or 'action_text' (override).")
        return data


class LiveValidateSerializer(StrictSerializerMixin, serializers.Serializer):
    action_text = serializers.CharField(allow_blank=True, max_length=5000, trim_whitespace=False)


class PromoteSerializer(StrictSerializerMixin, serializers.Serializer):
    force = serializers.BooleanField(
        required=False, default=False, help_text="Promote even if the model's endpoint does not answer now."
    )


class LiveRetrySerializer(StrictSerializerMixin, serializers.Serializer):
    switch_to_active = serializers.BooleanField(
        required=False, default=False, help_text="Make the active model this trajectory's proposer first."
    )


class LiveEndSerializer(StrictSerializerMixin, serializers.Serializer):
    reason = serializers.ChoiceField(choices=["abandoned"], default="abandoned")
