"""API views: thin wrappers that check the capability, validate input and call the domain functions."""

from __future__ import annotations

from django.conf import settings
from django.db.models import ProtectedError
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.parsers import JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from flywheel.models import ModelVersion
from flywheel.serving import serving_problem

from .. import trajectories
from ..live import sessions as live
from ..models import Trajectory, User
from ..permissions import Capability, allows, can, can_edit_trajectory, tasks_visible_to, trajectories_visible_to
from ..task_import import import_tasks
from ..upload_checks import check_size
from . import serializers as s


class TaskViewSet(viewsets.ModelViewSet):
    """Tasks of the pool. Everyone may read what they can see; data leads create, import, edit and delete."""

    serializer_class = s.TaskSerializer

    def get_permissions(self):  # type: ignore[no-untyped-def]
        needed = Capability.VIEW_TASKS if self.action in ("list", "retrieve") else Capability.MANAGE_TASKS
        return [allows(needed)()]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        queryset = tasks_visible_to(self.request.user).order_by("-importance", "id")
        for name in ("status", "domain", "platform"):
            if value := self.request.query_params.get(name):
                queryset = queryset.filter(**{name: value})
        return queryset

    def perform_create(self, serializer: s.TaskSerializer) -> None:
        serializer.save(created_by=self.request.user)

    def destroy(self, request: Request, *args, **kwargs) -> Response:  # type: ignore[no-untyped-def]
        try:
            return super().destroy(request, *args, **kwargs)
        except ProtectedError:
            return Response(
                {"detail": "This task has trajectories; archive it (status) instead of deleting it."},
                status=status.HTTP_409_CONFLICT,
            )

    @extend_schema(request=s.TaskImportSerializer, responses={201: s.TaskImportResultSerializer})
    @action(detail=False, methods=["post"], url_path="import", parser_classes=[MultiPartParser])
    def import_file(self, request: Request) -> Response:
        """Import tasks from a JSON / JSON Lines file; all or nothing, with per-record errors."""
        form = s.TaskImportSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        upload = form.validated_data["file"]
        check_size(upload, what="file", max_bytes=settings.MAX_TASK_IMPORT_BYTES)
        result = import_tasks(
            upload.read(), upload.name, created_by=request.user, on_conflict=form.validated_data["on_conflict"]
        )
        return Response({"created": result.created, "skipped": result.skipped}, status=status.HTTP_201_CREATED)


class NextTaskView(APIView):
    """The annotator's current task, or the next one from the queue (atomic: no two annotators get the same task)."""

    permission_classes = [allows(Capability.ANNOTATE)]
    parser_classes = [JSONParser]

    @extend_schema(request=s.NextTaskRequestSerializer, responses={200: s.AssignmentSerializer})
    def post(self, request: Request) -> Response:
        form = s.NextTaskRequestSerializer(data=request.data or {})
        form.is_valid(raise_exception=True)
        assignment = live.next_task(request.user, skip_current=form.validated_data["skip_current"])
        return Response(s.AssignmentSerializer(assignment).data)


class TrajectoryViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Trajectories: annotators record their own; data leads and ML engineers read all; data leads review."""

    def get_permissions(self):  # type: ignore[no-untyped-def]
        if self.action in ("create", "add_step", "add_recording", "submit"):
            return [allows(Capability.ANNOTATE)()]
        if self.action == "add_review":
            return [allows(Capability.REVIEW)()]
        return [allows(Capability.ANNOTATE, Capability.VIEW_TRAJECTORIES)()]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        queryset = trajectories_visible_to(self.request.user).select_related("annotator")
        if self.action == "list":
            queryset = queryset.with_step_count()
            for name in ("status", "mode", "task"):
                if value := self.request.query_params.get(name):
                    queryset = queryset.filter(**{name: value})
        elif self.action == "retrieve":
            queryset = queryset.prefetch_related("steps", "recordings", "reviews__reviewer")
        return queryset

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        if self.action == "create":
            return s.TrajectoryCreateSerializer
        if self.action == "retrieve":
            return s.TrajectoryDetailSerializer
        return s.TrajectorySerializer

    def _editable(self) -> Trajectory:
        trajectory = self.get_object()
        if not can_edit_trajectory(self.request.user, trajectory):
            raise PermissionDenied("Only the trajectory's annotator may change it, and only while it is in progress.")
        return trajectory

    @extend_schema(request=s.TrajectoryCreateSerializer, responses={201: s.TrajectorySerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:  # type: ignore[no-untyped-def]
        form = s.TrajectoryCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = dict(form.validated_data)
        trajectory = trajectories.start_trajectory(request.user, data.pop("task"), data.pop("mode"), **data)
        return Response(s.TrajectorySerializer(trajectory).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.StepCreateSerializer, responses={201: s.StepSerializer})
    @action(detail=True, methods=["post"], url_path="steps", parser_classes=[MultiPartParser, JSONParser])
    def add_step(self, request: Request, pk: str | None = None) -> Response:
        trajectory = self._editable()
        form = s.StepCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        fields = dict(form.validated_data)
        step = trajectories.add_step(
            trajectory,
            index=fields.pop("index", None),
            screenshot=fields.pop("screenshot", None),
            screenshot_sha256=fields.pop("screenshot_sha256", None),
            fields=fields,
        )
        return Response(s.StepSerializer(step).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.RecordingCreateSerializer, responses={201: s.RecordingSerializer})
    @action(detail=True, methods=["post"], url_path="recordings", parser_classes=[MultiPartParser])
    def add_recording(self, request: Request, pk: str | None = None) -> Response:
        trajectory = self._editable()
        form = s.RecordingCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        recording = trajectories.add_recording(
            trajectory,
            **{
                "audio": None,
                "events": None,
                **form.validated_data,
            },
        )
        return Response(s.RecordingSerializer(recording).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: s.TrajectorySerializer})
    @action(detail=True, methods=["post"])
    def submit(self, request: Request, pk: str | None = None) -> Response:
        trajectory = trajectories.submit(self._editable())
        return Response(s.TrajectorySerializer(trajectory).data)

    @extend_schema(request=s.ReviewSerializer, responses={201: s.ReviewSerializer})
    @action(detail=True, methods=["post"], url_path="reviews", parser_classes=[JSONParser])
    def add_review(self, request: Request, pk: str | None = None) -> Response:
        trajectory = self.get_object()
        form = s.ReviewSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        result = trajectories.review(trajectory, request.user, **form.validated_data)
        return Response(s.ReviewSerializer(result).data, status=status.HTTP_201_CREATED)


class ModelVersionViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """The model registry: ML engineers register checkpoints and promote one to propose actions to annotators."""

    serializer_class = s.ModelVersionSerializer
    queryset = ModelVersion.objects.all()

    def get_permissions(self):  # type: ignore[no-untyped-def]
        if self.action in ("list", "retrieve"):
            return [allows(Capability.VIEW_FLYWHEEL)()]
        return [allows(Capability.MANAGE_MODELS)()]

    def perform_create(self, serializer: s.ModelVersionSerializer) -> None:
        serializer.save(created_by=self.request.user)

    @extend_schema(request=s.PromoteSerializer, responses={200: s.ModelVersionSerializer})
    @action(detail=True, methods=["post"])
    def promote(self, request: Request, pk: str | None = None) -> Response:
        """Make this the annotation model once its endpoint answers (409 with the reason otherwise); `force` skips
        the check."""
        model = self.get_object()
        form = s.PromoteSerializer(data=request.data or {})
        form.is_valid(raise_exception=True)
        if not form.validated_data["force"] and (problem := serving_problem(model)):
            why = f"{model.name} was not promoted: {problem}. Send force=true to promote it anyway."
            raise trajectories.Conflict(why)
        model.promote(by=request.user, forced=form.validated_data["force"], reason="promoted through /api/models/")
        return Response(s.ModelVersionSerializer(model).data)


def whoami_payload(user: User) -> dict[str, object]:
    return {
        "username": user.username,
        "role": user.role,
        "capabilities": sorted(c.value for c in Capability if can(user, c)),
    }


class WhoAmIView(APIView):
    """Who the token or session belongs to, and what they may do (used by the recorder and CLIs)."""

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        return Response(whoami_payload(request.user))
