"""URLs of the quality app, mounted at the site root by annotation_app.urls."""

from django.urls import path  # noqa: F401

urlpatterns: list = []
