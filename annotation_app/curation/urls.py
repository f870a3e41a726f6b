"""URLs of the curation app, mounted at the site root by annotation_app.urls."""

from django.urls import path

from . import views

urlpatterns: list = [
    path("lead/curation/", views.curation, name="curation"),
    path("lead/curation/runs/", views.runs, name="curation-runs"),
    path("lead/curation/verify/", views.verify, name="curation-verify"),
    path("lead/curation/dedup/", views.dedup, name="curation-dedup"),
]
