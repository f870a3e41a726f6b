"""URLs of the quality app, mounted at the site root by annotation_app.urls."""

from django.urls import path

from . import views

urlpatterns = [
    path("lead/quality/", views.quality, name="quality"),
    path("lead/quality/refresh/", views.refresh, name="quality-refresh"),
    path("lead/quality/acceptance/", views.acceptance, name="quality-acceptance"),
    path("lead/quality/csv/<slug:table>/", views.table_csv, name="quality-csv"),
]
