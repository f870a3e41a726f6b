"""API routes, the OpenAPI schema and its documentation pages."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from flywheel import api as flywheel_api

from .. import review_queue_views as review
from ..live import api as live
from . import insitu, views
from .auth import obtain_auth_token

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("tasks", views.TaskViewSet, basename="task")
router.register("trajectories", views.TrajectoryViewSet, basename="trajectory")
router.register("models", views.ModelVersionViewSet, basename="modelversion")

urlpatterns = [
    path("", include(router.urls)),
    path("flywheel/", include(flywheel_api.router.urls)),
    path("queue/next/", views.NextTaskView.as_view(), name="queue-next"),
    path("live/", live.LiveOpenView.as_view(), name="live-open"),
    path("live/<int:pk>/", live.LiveStateView.as_view(), name="live-state"),
    path("live/<int:pk>/step/", live.LiveStepView.as_view(), name="live-step"),
    path("live/<int:pk>/validate/", live.LiveValidateView.as_view(), name="live-validate"),
    path("live/<int:pk>/end/", live.LiveEndView.as_view(), name="live-end"),
    path("live/<int:pk>/proposals/", live.LiveRetryView.as_view(), name="live-retry"),
    path("live/<int:pk>/vnc-token/", live.LiveVncTokenView.as_view(), name="live-vnc-token"),
    path("live/<int:pk>/oracle-state/", live.LiveOracleStateView.as_view(), name="live-oracle-state"),
    path("insitu/uploads/", insitu.UploadStartView.as_view(), name="insitu-upload-start"),
    path("insitu/uploads/<int:pk>/", insitu.UploadView.as_view(), name="insitu-upload"),
    path("insitu/captures/<int:pk>/", insitu.TimelineView.as_view(), name="insitu-capture"),
    path("insitu/captures/<int:pk>/steps/<int:index>/thought/", insitu.ThoughtView.as_view(), name="insitu-thought"),
    path("insitu/captures/<int:pk>/submit/", insitu.SubmitView.as_view(), name="insitu-submit"),
    path("insitu/captures/<int:pk>/record/", insitu.RecordView.as_view(), name="insitu-record"),
    path("insitu/captures/<int:pk>/finish/", insitu.FinishView.as_view(), name="insitu-finish"),
    path("insitu/captures/<int:pk>/vnc-token/", insitu.CaptureVncTokenView.as_view(), name="insitu-vnc-token"),
    path("review/queue/", review.ReviewQueueView.as_view(), name="review-queue"),
    path("review/next/", review.NextReviewView.as_view(), name="review-next"),
    path("review/trajectories/<int:pk>/verdict/", review.VerdictView.as_view(), name="review-verdict"),
    path("me/", views.WhoAmIView.as_view(), name="me"),
    path("auth/token/", obtain_auth_token, name="auth-token"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
]
