"""Django admin for every model of the annotation domain."""

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from .models import Assignment, Capture, LiveSession, Recording, Review, Step, Task, Trajectory, User


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    list_display = ("username", "email", "role", "is_simulated", "is_staff", "is_active")
    list_filter = ("role", "is_simulated", "is_staff", "is_active")
    fieldsets = (*BaseUserAdmin.fieldsets, ("Role", {"fields": ("role", "is_simulated")}))
    add_fieldsets = (*BaseUserAdmin.add_fieldsets, ("Role", {"fields": ("role",)}))


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "external_id",
        "short_instruction",
        "platform",
        "domain",
        "difficulty",
        "importance",
        "status",
    )
    list_filter = ("status", "platform", "difficulty")
    search_fields = ("instruction", "external_id", "domain")
    raw_id_fields = ("parent", "created_by")
    show_full_result_count = False  # the pool holds 100k+ rows

    @admin.display(description="instruction")
    def short_instruction(self, task: Task) -> str:
        return task.instruction[:80]


@admin.register(Assignment)
class AssignmentAdmin(admin.ModelAdmin):
    list_display = ("id", "task", "annotator", "status", "assigned_at", "finished_at")
    list_filter = ("status",)
    raw_id_fields = ("task", "annotator")


class StepInline(admin.TabularInline):
    model = Step
    extra = 0
    fields = ("index", "source", "thought", "action_text", "screenshot")
    show_change_link = True


@admin.register(Trajectory)
class TrajectoryAdmin(admin.ModelAdmin):
    # The task column shows its id and the instruction's start: the whole instruction pushed the table off the page.
    list_display = ("id", "short_task", "annotator", "mode", "status", "simulated", "model_version", "created_at")
    list_filter = ("mode", "status", "simulated")
    list_select_related = ("task", "annotator", "model_version")
    raw_id_fields = ("task", "annotator", "model_version")
    inlines = [StepInline]
    show_full_result_count = False

    @admin.display(description="task", ordering="task")
    def short_task(self, trajectory: Trajectory) -> str:
        return f"#{trajectory.task_id} {trajectory.task.instruction[:60]}"


@admin.register(Step)
class StepAdmin(admin.ModelAdmin):
    list_display = ("id", "trajectory", "index", "source", "action_text")
    list_filter = ("source",)
    raw_id_fields = ("trajectory",)


@admin.register(Recording)
class RecordingAdmin(admin.ModelAdmin):
    list_display = ("id", "trajectory", "audio_content_type", "event_count", "duration_s", "created_at")
    raw_id_fields = ("trajectory",)


@admin.register(Review)
class ReviewAdmin(admin.ModelAdmin):
    list_display = ("id", "trajectory", "reviewer", "verdict", "score", "created_at")
    list_filter = ("verdict",)
    raw_id_fields = ("trajectory", "reviewer")


@admin.register(LiveSession)
class LiveSessionAdmin(admin.ModelAdmin):
    """Operators look here for stuck or failed live sessions; annotation_app.live.sessions changes their state."""

    list_display = ("trajectory", "status", "kind", "next_index", "proposals", "end_reason", "updated_at")
    list_filter = ("status", "kind", "proposals")
    readonly_fields = [f.name for f in LiveSession._meta.fields]


@admin.register(Capture)
class CaptureAdmin(admin.ModelAdmin):
    """Think-aloud captures: operators look for stuck uploads and failed processing; the pages change their state."""

    list_display = ("id", "annotator", "source", "status", "stage", "progress", "size", "trajectory", "created_at")
    list_filter = ("status", "source")
    search_fields = ("instruction", "session_id")
    raw_id_fields = ("annotator", "task", "trajectory")
    readonly_fields = ("sha256", "received", "meta", "transcript", "alignment", "signature", "created_at", "updated_at")
