"""Django admin for the model registry."""

from django.contrib import admin
from django.db import models

from .models import ModelVersion


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ("name", "checkpoint_uri", "endpoint_url", "is_active", "created_at")
    list_filter = ("is_active",)
    search_fields = ("name", "checkpoint_uri")
    raw_id_fields = ("parent", "created_by")
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}  # Django 6's default, without the warning
