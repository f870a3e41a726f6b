from django.apps import AppConfig


class QualityConfig(AppConfig):
    name = "annotation_app.quality"
    label = "quality"
    verbose_name = "Quality"
