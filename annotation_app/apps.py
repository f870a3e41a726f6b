from django.apps import AppConfig


class AnnotationAppConfig(AppConfig):
    name = "annotation_app"
    verbose_name = "Annotation"
