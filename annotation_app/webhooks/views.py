"""Pages to manage webhooks and read their delivery log (data leads and ML engineers)."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from ..permissions import Capability, requires
from . import manage
from .events import redeliver
from .models import Delivery, Event, Webhook

LOG_ROWS = 100


def _list(request: HttpRequest, *, error: str = "", form: dict | None = None, status: int = 200) -> HttpResponse:
    context = {
        "webhooks": Webhook.objects.all(),
        "events": [(e, Event(e).label) for e in manage.SUBSCRIBABLE],
        "error": error,
        "form": form or {"url": "", "events": [], "description": ""},
    }
    return render(request, "webhooks/list.html", context, status=status)


@require_GET
@requires(Capability.MANAGE_WEBHOOKS)
def webhooks(request: HttpRequest) -> HttpResponse:
    return _list(request)


@require_POST
@requires(Capability.MANAGE_WEBHOOKS)
def webhook_create(request: HttpRequest) -> HttpResponse:
    """Add a webhook; a refused one shows the form again with the reason (400) and what was typed."""
    form = {
        "url": request.POST.get("url", ""),
        "events": request.POST.getlist("events"),
        "description": request.POST.get("description", ""),
    }
    try:
        hook = manage.create(form["url"], form["events"], form["description"], by=request.user)
    except manage.WebhookRefused as exc:
        return _list(request, error=str(exc), form=form, status=400)
    return redirect("webhook", pk=hook.pk)


def _detail(request: HttpRequest, hook: Webhook, *, error: str = "", status: int = 200) -> HttpResponse:
    deliveries = hook.deliveries.all()
    wanted = request.GET.get("status", "")
    if wanted in Delivery.Status.values:
        deliveries = deliveries.filter(status=wanted)
    context = {
        "hook": hook,
        "deliveries": deliveries[:LOG_ROWS],
        "statuses": Delivery.Status.choices,
        "wanted": wanted,
        "events": [(e, Event(e).label) for e in manage.SUBSCRIBABLE],
        "error": error,
    }
    return render(request, "webhooks/detail.html", context, status=status)


@require_GET
@requires(Capability.MANAGE_WEBHOOKS)
def webhook(request: HttpRequest, pk: int) -> HttpResponse:
    return _detail(request, get_object_or_404(Webhook, pk=pk))


@require_POST
@requires(Capability.MANAGE_WEBHOOKS)
def webhook_change(request: HttpRequest, pk: int) -> HttpResponse:
    """Edit, pause, resume, rotate the secret, or ping; a refused change shows the page with the reason (400)."""
    hook = get_object_or_404(Webhook, pk=pk)
    action = request.POST.get("action", "")
    try:
        with transaction.atomic():
            if action == "edit":
                manage.update(
                    hook,
                    request.POST.get("url", ""),
                    request.POST.getlist("events"),
                    request.POST.get("description", ""),
                )
            elif action in ("pause", "resume"):
                manage.set_active(hook, action == "resume")
            elif action == "rotate":
                manage.rotate_secret(hook)
            elif action == "ping":
                manage.ping(hook, by=request.user)
            else:
                raise manage.WebhookRefused(f"Unknown action '{action[:40]}': edit, pause, resume, rotate or ping.")
    except manage.WebhookRefused as exc:
        hook.refresh_from_db()
        return _detail(request, hook, error=str(exc), status=400)
    return redirect("webhook", pk=hook.pk)


@require_POST
@requires(Capability.MANAGE_WEBHOOKS)
def webhook_delete(request: HttpRequest, pk: int) -> HttpResponse:
    get_object_or_404(Webhook, pk=pk).delete()
    return redirect("webhooks")


@require_POST
@requires(Capability.MANAGE_WEBHOOKS)
def delivery_redeliver(request: HttpRequest, pk: int) -> HttpResponse:
    """Send a logged delivery's body again, as a new delivery."""
    delivery = get_object_or_404(Delivery.objects.select_related("webhook"), pk=pk)
    with transaction.atomic():
        redeliver(delivery)
    return redirect("webhook", pk=delivery.webhook_id)
