"""Webhook subscriptions and their delivery log: every attempt's outcome is kept, as CVAT's delivery page shows."""

from __future__ import annotations

import secrets
import uuid

from django.conf import settings
from django.db import models


def new_secret() -> str:
    """A random signing secret, shown to whoever manages the webhook so receivers can check signatures."""
    return secrets.token_urlsafe(32)


class Event(models.TextChoices):
    """The platform events a webhook can subscribe to."""

    TRAJECTORY_SUBMITTED = "trajectory.submitted", "Trajectory submitted"
    TRAJECTORY_REVIEWED = "trajectory.reviewed", "Trajectory reviewed"
    TRAJECTORY_FLAGGED = "trajectory.flagged", "Trajectory flagged by curation"
    TASK_COMPLETED = "task.completed", "Task completed"
    ITERATION_FINISHED = "iteration.finished", "Flywheel iteration finished"
    MODEL_PROMOTED = "model.promoted", "Annotation model changed (promoted, rolled back, demoted)"
    PING = "ping", "Ping (sent on request, to test a receiver)"


class Webhook(models.Model):
    """An HTTPS (or loopback HTTP) endpoint that receives signed JSON POSTs for the events it subscribes to."""

    url = models.URLField(max_length=500)
    description = models.CharField(max_length=200, blank=True)
    events = models.JSONField(default=list, help_text="Event names (webhooks.models.Event) this endpoint receives.")
    secret = models.CharField(max_length=100, default=new_secret)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"webhook {self.pk} → {self.url}"


class Delivery(models.Model):
    """One event sent (or to be sent) to one webhook: its exact body, attempts, and the last response."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RETRYING = "retrying", "Retrying"
        SUCCEEDED = "succeeded", "Delivered"
        FAILED = "failed", "Failed (gave up)"

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False, help_text="X-Webhook-Delivery.")
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=40, choices=Event.choices)
    body = models.TextField(help_text="The exact JSON sent; every attempt sends the same bytes.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True, help_text="The start of the receiver's last answer.")
    error = models.TextField(blank=True, help_text="Why the last attempt failed (connection error, status code).")
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        indexes = [models.Index(fields=["webhook", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.event} to webhook {self.webhook_id} ({self.status})"
