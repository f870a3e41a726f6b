from django.apps import AppConfig


class CurationConfig(AppConfig):
    name = "annotation_app.curation"
    label = "curation"
    verbose_name = "Curation"
