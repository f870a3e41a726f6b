"""URL map: role pages, htmx fragments, API under /api/, admin, auth."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from flywheel import demo_views as flywheel_demo
from flywheel import views as flywheel_views

from . import adjudication_views, insitu_views, lead_views, review_queue_views, review_views, views
from .live import views as live_views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("accounts/login/", views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("annotate/", views.annotate, name="annotate"),
    path("annotate/next/", views.annotate_next, name="annotate-next"),
    path("annotate/unskip/", views.annotate_unskip, name="annotate-unskip"),
    path("annotate/live/", live_views.live_start, name="live-start"),
    path("live/<int:pk>/", live_views.live_page, name="live"),
    path("insitu/", insitu_views.captures, name="insitu"),
    path("insitu/token/", insitu_views.recorder_token, name="insitu-token"),
    path("insitu/browser/", insitu_views.browser_start, name="insitu-browser-start"),
    path("insitu/<int:pk>/", insitu_views.capture_page, name="insitu-capture-page"),
    path("insitu/<int:pk>/retry/", insitu_views.capture_retry, name="insitu-retry"),
    path("insitu/<int:pk>/delete/", insitu_views.capture_delete, name="insitu-delete"),
    path("lead/", views.lead, name="lead"),
    path("lead/import/", views.lead_import, name="lead-import"),
    path("lead/stats/", lead_views.lead_stats, name="lead-stats"),
    path("lead/trajectories/", lead_views.trajectories, name="lead-trajectories"),
    path("lead/trajectories/<int:pk>/", review_views.player, name="lead-trajectory"),
    path("lead/trajectories/<int:pk>/steps/<int:index>/verdict/", review_views.step_verdict, name="lead-step-verdict"),
    path("lead/trajectories/<int:pk>/steps/<int:index>/edit/", review_views.step_edit, name="lead-step-edit"),
    path("lead/trajectories/<int:pk>/steps/<int:index>/check/", review_views.step_check, name="lead-step-check"),
    path("lead/trajectories/<int:pk>/steps/<int:index>/cut/", review_views.step_cut, name="lead-step-cut"),
    path("lead/trajectories/<int:pk>/steps/<int:index>/restore/", review_views.step_restore, name="lead-step-restore"),
    path("lead/tasks/<int:pk>/", lead_views.task_page, name="lead-task"),
    path("lead/tasks/<int:pk>/change/", lead_views.task_change, name="lead-task-change"),
    path("lead/tasks/<int:pk>/overlap/", adjudication_views.task_overlap, name="lead-task-overlap"),
    path("lead/tasks/<int:pk>/adjudicate/", adjudication_views.adjudicate_page, name="lead-adjudicate"),
    path("lead/agreement/", adjudication_views.agreement_page, name="lead-agreement"),
    path("lead/trajectories/<int:pk>/verdict/", review_queue_views.trajectory_verdict, name="lead-trajectory-verdict"),
    path("lead/review/", review_queue_views.review_queue_page, name="lead-review-queue"),
    path("lead/review/next/", review_queue_views.review_next, name="lead-review-next"),
    path("lead/review/release/", review_queue_views.review_release, name="lead-review-release"),
    path("lead/projects/", review_queue_views.projects, name="lead-projects"),
    path("trajectories/<int:pk>/", views.trajectory_detail, name="trajectory"),
    path("trajectories/<int:pk>/review/", views.trajectory_review, name="trajectory-review"),
    path("trajectories/<int:pk>/fix/", views.trajectory_fix, name="trajectory-fix"),
    path("trajectories/<int:pk>/retry/", views.trajectory_retry, name="trajectory-retry"),
    path("flywheel/", flywheel_views.overview, name="flywheel"),
    path("flywheel/models/", flywheel_views.registry, name="flywheel-models"),
    path("flywheel/models/register/", flywheel_views.register, name="flywheel-register"),
    path("flywheel/models/demote/", flywheel_views.demote, name="flywheel-demote"),
    path("flywheel/models/<int:pk>/promote/", flywheel_views.promote, name="flywheel-promote"),
    path("flywheel/models/<int:pk>/rollback/", flywheel_views.rollback, name="flywheel-rollback"),
    path("flywheel/models/<int:pk>/health/", flywheel_views.model_health, name="flywheel-model-health"),
    path("flywheel/iterations/", flywheel_views.start, name="flywheel-start"),
    path("flywheel/iterations/<int:pk>/", flywheel_views.iteration_detail, name="flywheel-iteration"),
    path("flywheel/iterations/<int:pk>/cancel/", flywheel_views.cancel, name="flywheel-cancel"),
    path("flywheel/stores/", flywheel_views.stores, name="flywheel-stores"),
    path("flywheel/stores/<int:pk>/files/<path:path>", flywheel_views.dataset_file, name="flywheel-dataset-file"),
    path("flywheel/demo/", flywheel_demo.demo_page, name="flywheel-demo"),
    path("flywheel/demo/report.json", flywheel_demo.demo_json, name="flywheel-demo-json"),
    path("flywheel/demo/report.png", flywheel_demo.demo_png, name="flywheel-demo-png"),
    path("media/<path:path>", views.media, name="media"),
    path("api/", include("annotation_app.api.urls")),
    path("", include("annotation_app.quality.urls")),
    path("", include("annotation_app.curation.urls")),
    path("", include("annotation_app.webhooks.urls")),
    path("admin/", admin.site.urls),
]

handler400 = "annotation_app.errors.bad_request"
handler403 = "annotation_app.errors.permission_denied"
handler404 = "annotation_app.errors.page_not_found"
handler500 = "annotation_app.errors.server_error"
