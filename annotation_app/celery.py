"""The Celery application: configured from Django settings (CELERY_*), tasks discovered in every app."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annotation_app.settings")

app = Celery("annotation_app")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
