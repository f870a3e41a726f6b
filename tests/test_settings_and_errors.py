"""Production safety: refuse to start with DEBUG or the default key; error pages never show a traceback."""

import os
import subprocess
import sys

import pytest
from django.test import override_settings
from django.urls import reverse


def _start(**env):
    code = "import django; django.setup(); print('started')"
    environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "annotation_app.settings", **env}
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DJANGO_DEBUG": "1", "DJANGO_SECRET_KEY": "x" * 50}, "DJANGO_DEBUG must be off"),
        ({"DJANGO_DEBUG": "0"}, "Set DJANGO_SECRET_KEY"),
        ({"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": "short"}, "Set DJANGO_SECRET_KEY"),
    ],
)
def test_production_refuses_unsafe_settings(env, message):
    result = _start(DJANGO_ENV="production", **env)
    assert result.returncode != 0 and message in result.stderr


def test_production_starts_with_safe_settings():
    result = _start(DJANGO_ENV="production", DJANGO_DEBUG="0", DJANGO_SECRET_KEY="k" * 50)
    assert result.returncode == 0 and "started" in result.stdout, result.stderr


@override_settings(DEBUG=False)
def test_unexpected_errors_get_a_plain_500_page(client, lead, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr("annotation_app.task_pool.status_counts", boom)
    client.raise_request_exception = False
    client.force_login(lead)
    response = client.get(reverse("lead"))
    assert response.status_code == 500
    body = response.content.decode()
    assert "Something went wrong" in body and "secret internals" not in body and "Traceback" not in body


@override_settings(DEBUG=False)
def test_pages_404_and_403_are_friendly(client, annotator):
    client.force_login(annotator)
    response = client.get("/no/such/page/")
    assert response.status_code == 404 and "There is nothing here" in response.content.decode()
    response = client.get(reverse("lead"))
    assert response.status_code == 403 and "Your role may not manage tasks." in response.content.decode()


@override_settings(DEBUG=True)
def test_with_debug_on_an_unknown_url_gets_the_same_page_not_the_url_conf(client, annotator):
    client.force_login(annotator)
    response = client.get("/no/such/page/")
    body = response.content.decode()
    assert response.status_code == 404 and "There is nothing here" in body
    assert "URLconf" not in body and "annotation_app.urls" not in body
    response = client.get("/trajectories/999999/")  # a view's own 404 is styled too
    assert response.status_code == 404 and "URLconf" not in response.content.decode()
    assert client.get("/api/trajectories/999999/").json().get("detail")  # the API's JSON 404 is left alone


def test_oversized_form_body_is_a_400(client, lead, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    client.force_login(lead)
    response = client.post(reverse("lead-import"), {"comment": "x" * 5000})
    assert response.status_code == 400
