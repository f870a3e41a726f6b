"""The flywheel's REST API: iterations (start, list, detail, cancel, their validations) and the store versions.

ML engineers start and cancel; data leads and ML engineers read. Mounted at /api/flywheel/ (annotation_app/api/urls)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import DefaultRouter

from annotation_app.api.serializers import StrictSerializerMixin
from annotation_app.models import Trajectory
from annotation_app.permissions import allows

from .iterations import IterationError, cancel_iteration, start_iteration
from .models import DatasetVersion, Iteration, ModelVersion, Stage, Validation
from .permissions import READ, RUN


class IterationSerializer(serializers.ModelSerializer):
    started_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    # Plain text: the Stage choices appear once in the schema (the start serializer's `stages`).
    current_stage = serializers.CharField(read_only=True, help_text="The stage running now (or last run).")

    class Meta:
        model = Iteration
        fields = [
            "id", "started_by", "base_model", "scope", "modes", "domains", "date_from", "date_to", "scope_until",
            "selected_stages", "config", "status", "current_stage", "stages", "cancel_requested", "error",
            "created_at", "started_at", "finished_at",
        ]  # fmt: skip
        read_only_fields = fields


class IterationStartSerializer(StrictSerializerMixin, serializers.Serializer):
    """What an ML engineer sets when starting an iteration."""

    base_model = serializers.PrimaryKeyRelatedField(
        queryset=ModelVersion.objects.all(), required=False, allow_null=True
    )
    scope = serializers.ChoiceField(choices=Iteration.Scope.choices, default=Iteration.Scope.NEW)
    modes = serializers.ListField(child=serializers.ChoiceField(choices=Trajectory.Mode.choices), default=list)
    domains = serializers.ListField(child=serializers.CharField(max_length=100), default=list)
    date_from = serializers.DateTimeField(required=False, allow_null=True)
    date_to = serializers.DateTimeField(required=False, allow_null=True)
    stages = serializers.ListField(
        child=serializers.ChoiceField(choices=Stage.choices), default=lambda: [Stage.VALIDATE, Stage.EXPORT]
    )
    config = serializers.DictField(
        required=False,
        default=dict,
        help_text='{"v": {weights, threshold, rules…}, "export": {"coordinates": "absolute" | "relative1000"}}',
    )


class ValidationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Validation
        fields = ["trajectory", "v", "components", "route", "reason", "threshold", "created_at"]
        read_only_fields = fields


class DatasetVersionSerializer(serializers.ModelSerializer):
    parent_number = serializers.IntegerField(source="parent.number", read_only=True, allow_null=True)

    class Meta:
        model = DatasetVersion
        fields = [
            "id", "kind", "number", "parent", "parent_number", "iteration", "row_count", "added_count", "manifest",
            "created_at",
        ]  # fmt: skip
        read_only_fields = fields


def _start(user: Any, data: dict[str, Any]) -> Iteration:
    with transaction.atomic():
        return start_iteration(
            user,
            base_model=data.get("base_model"),
            scope=data["scope"],
            modes=data["modes"],
            domains=data["domains"],
            date_from=data.get("date_from"),
            date_to=data.get("date_to"),
            stages=data["stages"],
            config=data["config"],
        )


class IterationViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Flywheel iterations: start one (queued on the `flywheel` Celery queue), watch its stages, cancel it."""

    queryset = Iteration.objects.select_related("started_by")
    serializer_class = IterationSerializer

    def get_permissions(self):  # type: ignore[no-untyped-def]
        if self.action in ("create", "cancel"):
            return [allows(RUN)()]
        return [allows(*READ)()]

    @extend_schema(request=IterationStartSerializer, responses={201: IterationSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        form = IterationStartSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            iteration = _start(request.user, form.validated_data)
        except IterationError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        return Response(IterationSerializer(iteration).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: IterationSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        try:
            iteration = cancel_iteration(self.get_object())
        except IterationError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(IterationSerializer(iteration).data)

    @extend_schema(responses={200: ValidationSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def validations(self, request: Request, pk: str | None = None) -> Response:
        """What was routed where, and why (paginated); `?route=sft|ct|held` narrows it."""
        rows = Validation.objects.filter(iteration=self.get_object()).order_by("trajectory_id")
        route = request.query_params.get("route")
        if route:
            if route not in ("sft", "ct", "held"):
                return Response({"detail": "route must be sft, ct or held"}, status=status.HTTP_400_BAD_REQUEST)
            rows = rows.filter(route=route)
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(ValidationSerializer(page, many=True).data)


class DatasetVersionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Versions of the SFT and CT stores, with their manifests (counts, files and their SHA-256, lineage)."""

    queryset = DatasetVersion.objects.select_related("parent").order_by("-created_at", "-id")
    serializer_class = DatasetVersionSerializer
    permission_classes = [allows(*READ)]


router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("iterations", IterationViewSet, basename="flywheel-iteration")
router.register("datasets", DatasetVersionViewSet, basename="flywheel-dataset")
