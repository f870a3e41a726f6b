"""The Django project and the annotation domain: tasks, trajectories, steps, recordings, roles, review, REST API."""

from .celery import app as celery_app

__all__ = ["celery_app"]
