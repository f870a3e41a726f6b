"""The webhook pages: every route for every role, and bad input answered with the form again and a 400."""

from __future__ import annotations

import pytest
from django.urls import reverse

from annotation_app.webhooks import manage
from annotation_app.webhooks.models import Delivery, Event, Webhook

from ..access import client_as
from ..conftest import ROLES

A, L, M, S = "annotator", "data_lead", "ml_engineer", "superuser"
MANAGERS = {L, M, S}

# (url name, method, roles allowed); tests/test_authorization.py takes these names as covered.
WEBHOOK_MATRIX: list[tuple[str, str, set[str]]] = [
    ("webhooks", "get", MANAGERS),
    ("webhook-create", "post", MANAGERS),
    ("webhook", "get", MANAGERS),
    ("webhook-change", "post", MANAGERS),
    ("webhook-delete", "post", MANAGERS),
    ("webhook-redeliver", "post", MANAGERS),
]
WEBHOOK_ROUTES = {name for name, *_ in WEBHOOK_MATRIX}


@pytest.fixture
def hook(db):
    return manage.create("https://example.org/hook", [Event.TASK_COMPLETED], "", by=None)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("name", "method", "allowed"), WEBHOOK_MATRIX, ids=[f"{m} {n}" for n, m, _ in WEBHOOK_MATRIX])
def test_authorization(role, name, method, allowed, hook, make_user):
    delivery = manage.ping(hook, by=None)
    args = {"webhooks": [], "webhook-create": [], "webhook-redeliver": [delivery.pk]}.get(name, [hook.pk])
    response = getattr(client_as(role, make_user), method)(reverse(name, args=args))
    code = response.status_code
    assert code != 500
    if role in allowed:
        assert code not in (401, 403) and "/accounts/login/" not in response.get("Location", ""), code
    elif role == "anonymous":
        assert code == 302 and response["Location"].startswith(reverse("login")), code
    else:
        assert code == 403, code


@pytest.mark.parametrize(
    ("post", "message"),
    [
        ({"url": "ftp://example.org/x", "events": ["task.completed"]}, "not an http:// or https:// URL"),
        ({"url": "not a url", "events": ["task.completed"]}, "not an http:// or https:// URL"),
        ({"url": "https://example.org/x"}, "Choose at least one event"),
        ({"url": "https://example.org/x", "events": ["task.exploded"]}, "Unknown event(s): task.exploded"),
        ({"url": "https://example.org/x", "events": ["ping"]}, "Unknown event(s): ping"),
    ],
)
def test_a_refused_webhook_shows_why_and_keeps_what_was_typed(post, message, make_user):
    client = client_as(L, make_user)
    response = client.post(reverse("webhook-create"), post)
    assert response.status_code == 400
    page = response.content.decode()
    assert message in page and 'role="alert"' in page
    assert post["url"].replace("&", "&amp;") in page
    assert not Webhook.objects.exists()


def test_a_lead_adds_pings_pauses_rotates_and_deletes(make_user):
    client = client_as(L, make_user)
    response = client.post(
        reverse("webhook-create"), {"url": "https://example.org/x", "events": ["task.completed", "model.promoted"]}
    )
    hook = Webhook.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("webhook", args=[hook.pk])
    assert hook.events == ["task.completed", "model.promoted"] and hook.active
    page = client.get(reverse("webhook", args=[hook.pk])).content.decode()
    assert hook.secret in page
    secret = hook.secret
    for action in ("ping", "pause", "rotate"):
        assert client.post(reverse("webhook-change", args=[hook.pk]), {"action": action}).status_code == 302
    hook.refresh_from_db()
    assert not hook.active and hook.secret != secret
    assert list(Delivery.objects.values_list("event", flat=True)) == ["ping"]
    delivery = Delivery.objects.get()
    assert client.post(reverse("webhook-redeliver", args=[delivery.pk])).status_code == 302
    assert Delivery.objects.count() == 2
    log = client.get(reverse("webhook", args=[hook.pk]) + "?status=pending").content.decode()
    assert log.count("Redeliver") == 2
    bad = client.post(reverse("webhook-change", args=[hook.pk]), {"action": "explode"})
    assert bad.status_code == 400 and "Unknown action" in bad.content.decode()
    edit = client.post(reverse("webhook-change", args=[hook.pk]), {"action": "edit", "url": "gopher://x", "events": []})
    assert edit.status_code == 400 and "not an http" in edit.content.decode()
    hook.refresh_from_db()
    assert hook.url == "https://example.org/x", "a refused edit changes nothing"
    assert client.post(reverse("webhook-delete", args=[hook.pk])).status_code == 302
    assert not Webhook.objects.exists() and not Delivery.objects.exists()
    assert client.get(reverse("webhook", args=[hook.pk])).status_code == 404
