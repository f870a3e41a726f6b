"""URLs of the webhooks app, mounted at the site root by annotation_app.urls."""

from django.urls import path

from . import views

urlpatterns = [
    path("webhooks/", views.webhooks, name="webhooks"),
    path("webhooks/new/", views.webhook_create, name="webhook-create"),
    path("webhooks/<int:pk>/", views.webhook, name="webhook"),
    path("webhooks/<int:pk>/change/", views.webhook_change, name="webhook-change"),
    path("webhooks/<int:pk>/delete/", views.webhook_delete, name="webhook-delete"),
    path("webhooks/deliveries/<int:pk>/redeliver/", views.delivery_redeliver, name="webhook-redeliver"),
]
