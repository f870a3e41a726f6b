"""API routes, the OpenAPI schema and its documentation pages."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.routers import DefaultRouter

from . import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("tasks", views.TaskViewSet, basename="task")
router.register("trajectories", views.TrajectoryViewSet, basename="trajectory")
router.register("models", views.ModelVersionViewSet, basename="modelversion")

urlpatterns = [
    path("", include(router.urls)),
    path("queue/next/", views.NextTaskView.as_view(), name="queue-next"),
    path("me/", views.WhoAmIView.as_view(), name="me"),
    path("auth/token/", obtain_auth_token, name="auth-token"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
]
