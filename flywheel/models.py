"""The model registry: every policy checkpoint the flywheel trains, and which one proposes actions to annotators."""

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q


class ModelVersion(models.Model):
    """A trained policy checkpoint and where it is served (an OpenAI-compatible endpoint such as `vllm serve`)."""

    name = models.CharField(max_length=100, unique=True)
    checkpoint_uri = models.CharField(max_length=500, help_text="Path or URI of the weights.")
    endpoint_url = models.URLField(blank=True, help_text="OpenAI-compatible base URL serving this checkpoint.")
    served_name = models.CharField(
        max_length=200, blank=True, help_text="Model name the endpoint serves it under (vLLM --served-model-name)."
    )
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    is_active = models.BooleanField(default=False, help_text="The model that proposes actions in live annotation.")
    metrics = models.JSONField(default=dict, blank=True)
    notes = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["is_active"], condition=Q(is_active=True), name="one_active_model"),
        ]

    def __str__(self) -> str:
        return self.name + (" (active)" if self.is_active else "")

    @property
    def model_name(self) -> str:
        return self.served_name or self.name

    @transaction.atomic
    def promote(self) -> None:
        """Make this the annotation model; the previously active one steps down in the same transaction."""
        ModelVersion.objects.select_for_update().filter(is_active=True).exclude(pk=self.pk).update(is_active=False)
        ModelVersion.objects.filter(pk=self.pk).update(is_active=True)
        self.is_active = True
