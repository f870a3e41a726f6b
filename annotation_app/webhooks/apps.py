from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "annotation_app.webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"

    def ready(self) -> None:
        from .signals import connect

        connect()
