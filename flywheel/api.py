"""The flywheel's REST API: iterations (start, list, detail, cancel, their validations), the store versions, and the
model registry with its lineage (register, promote, roll back, demote) and promotion history.

ML engineers start, cancel, register and promote; data leads and ML engineers read. Mounted at /api/flywheel/
(annotation_app/api/urls)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import DefaultRouter

from annotation_app.api.serializers import StrictSerializerMixin
from annotation_app.models import Trajectory
from annotation_app.permissions import allows

from . import registry
from .iterations import IterationError, cancel_iteration, start_iteration
from .models import DatasetVersion, Iteration, ModelPromotion, ModelVersion, Stage, Validation
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


class PromotionSerializer(serializers.ModelSerializer):
    by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    from_name = serializers.CharField(source="from_model.name", read_only=True, allow_null=True, default=None)
    to_name = serializers.CharField(source="to_model.name", read_only=True, allow_null=True, default=None)

    class Meta:
        model = ModelPromotion
        fields = [
            "id", "action", "from_model", "from_name", "to_model", "to_name", "by", "forced", "reason", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class ModelLineageSerializer(serializers.ModelSerializer):
    """A registered model with its lineage, evaluation, serving and promotion history."""

    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    stage = serializers.CharField(read_only=True, help_text="The iteration's stage that trained it; empty: by hand.")
    promotions = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = [
            "id", "name", "checkpoint_uri", "endpoint_url", "served_name", "parent", "is_active", "iteration", "stage",
            "dataset_versions", "metrics", "evaluation", "serve_command", "notes", "created_by", "created_at",
            "promotions",
        ]  # fmt: skip
        read_only_fields = fields

    def get_promotions(self, model: ModelVersion) -> list[dict[str, Any]]:
        """The changes of the annotation model to or from this one, newest first."""
        rows = {p.pk: p for p in [*model.promotions_from.all(), *model.promotions_to.all()]}.values()
        ordered = sorted(rows, key=lambda p: (p.created_at, p.pk), reverse=True)
        return PromotionSerializer(ordered, many=True).data


class RegisterSerializer(StrictSerializerMixin, serializers.Serializer):
    """A model trained or served elsewhere."""

    name = serializers.CharField(max_length=100)
    checkpoint_uri = serializers.CharField(max_length=500)
    endpoint_url = serializers.URLField(required=False, allow_blank=True, default="")
    served_name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    parent = serializers.PrimaryKeyRelatedField(queryset=ModelVersion.objects.all(), required=False, allow_null=True)
    notes = serializers.CharField(required=False, allow_blank=True, default="")


class ChangeSerializer(StrictSerializerMixin, serializers.Serializer):
    force = serializers.BooleanField(default=False, help_text="Promote even when its endpoint does not serve it.")
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class DemoteSerializer(StrictSerializerMixin, serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


def _conflict(exc: registry.RegistryError) -> Response:
    return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)


class ModelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The model registry with lineage: register a model, promote it, roll back to an earlier one, demote."""

    queryset = ModelVersion.objects.select_related("created_by").prefetch_related(
        "dataset_versions",
        Prefetch("promotions_from", queryset=ModelPromotion.objects.select_related("from_model", "to_model", "by")),
        Prefetch("promotions_to", queryset=ModelPromotion.objects.select_related("from_model", "to_model", "by")),
    )
    serializer_class = ModelLineageSerializer

    def get_permissions(self):  # type: ignore[no-untyped-def]
        if self.action in ("create", "promote", "rollback", "demote"):
            return [allows(RUN)()]
        return [allows(*READ)()]

    @extend_schema(request=RegisterSerializer, responses={201: ModelLineageSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        form = RegisterSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            model = registry.register_by_hand(request.user, **form.validated_data)
        except registry.RegistryError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        return Response(ModelLineageSerializer(model).data, status=status.HTTP_201_CREATED)

    def _change(self, request: Request, change: Any) -> Response:
        form = ChangeSerializer(data=request.data or {})
        form.is_valid(raise_exception=True)
        model = self.get_object()
        try:
            change(model, by=request.user, **form.validated_data)
        except registry.NotServable as exc:
            return Response({"detail": f"{exc}. Send force=true to do it anyway."}, status=status.HTTP_409_CONFLICT)
        except registry.RegistryError as exc:
            return _conflict(exc)
        return Response(ModelLineageSerializer(self.get_queryset().get(pk=model.pk)).data)

    @extend_schema(request=ChangeSerializer, responses={200: ModelLineageSerializer})
    @action(detail=True, methods=["post"])
    def promote(self, request: Request, pk: str | None = None) -> Response:
        """Make it the annotation model once its endpoint serves it (409 with the reason otherwise)."""
        return self._change(request, registry.promote)

    @extend_schema(request=ChangeSerializer, responses={200: ModelLineageSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request: Request, pk: str | None = None) -> Response:
        """Go back to an earlier model (registered before the active one, or active before)."""
        return self._change(request, registry.rollback)

    @extend_schema(request=DemoteSerializer, responses={200: PromotionSerializer})
    @action(detail=False, methods=["post"])
    def demote(self, request: Request) -> Response:
        """Leave no model active (409 when none is)."""
        form = DemoteSerializer(data=request.data or {})
        form.is_valid(raise_exception=True)
        try:
            record = registry.demote(by=request.user, **form.validated_data)
        except registry.RegistryError as exc:
            return _conflict(exc)
        return Response(PromotionSerializer(record).data)


class PromotionViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Every change of the annotation model: who, when, from which model to which, forced or not, and why."""

    queryset = ModelPromotion.objects.select_related("from_model", "to_model", "by")
    serializer_class = PromotionSerializer
    permission_classes = [allows(*READ)]


router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("iterations", IterationViewSet, basename="flywheel-iteration")
router.register("datasets", DatasetVersionViewSet, basename="flywheel-dataset")
router.register("models", ModelViewSet, basename="flywheel-model")
router.register("promotions", PromotionViewSet, basename="flywheel-promotion")
