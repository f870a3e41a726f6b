"""Django admin for the model registry (with lineage and promotion history), iterations, stores and validations."""

from django.contrib import admin
from django.db import models

from .models import DatasetVersion, Iteration, ModelPromotion, ModelVersion, Validation


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ("name", "stage", "iteration", "parent", "endpoint_url", "is_active", "created_at")
    list_filter = ("is_active", "stage")
    search_fields = ("name", "checkpoint_uri")
    raw_id_fields = ("parent", "created_by", "iteration")
    filter_horizontal = ("dataset_versions",)
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}  # Django 6's default, without the warning


@admin.register(Iteration)
class IterationAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "current_stage", "scope", "started_by", "created_at", "finished_at")
    list_filter = ("status",)
    raw_id_fields = ("started_by", "base_model")


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = ("kind", "number", "parent", "iteration", "row_count", "added_count", "created_at")
    list_filter = ("kind",)
    raw_id_fields = ("parent", "iteration")


@admin.register(Validation)
class ValidationAdmin(admin.ModelAdmin):
    list_display = ("iteration", "trajectory", "v", "route", "reason")
    list_filter = ("route",)
    raw_id_fields = ("iteration", "trajectory")


@admin.register(ModelPromotion)
class ModelPromotionAdmin(admin.ModelAdmin):
    list_display = ("created_at", "action", "from_model", "to_model", "by", "forced", "reason")
    list_filter = ("action", "forced")
    raw_id_fields = ("from_model", "to_model", "by")
