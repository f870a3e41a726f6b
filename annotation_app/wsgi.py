"""WSGI entry point: plain HTTP served by gunicorn's threads, without ASGI's thread hop per request."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annotation_app.settings")
application = get_wsgi_application()
