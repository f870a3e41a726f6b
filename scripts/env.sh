# Shared settings for the project's scripts: paths, ports and the environment the app reads.
# Sourced, not executed. Every value can be overridden from the caller's environment.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VAR="${VAR_DIR:-$ROOT/var}"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

export PGHOST="${PGHOST:-127.0.0.1}"
export PGPORT="${PGPORT:-54320}"
export DATABASE_NAME="${DATABASE_NAME:-annotation}"
export DATABASE_USER="${DATABASE_USER:-annotation}"
export REDIS_PORT="${REDIS_PORT:-63790}"
# The database's and Redis's passwords: made once per installation and kept private under var/ (mode 0600), never
# a default anyone can read in the code. scripts/services gives the database role its password.
secret_in_var() {
  mkdir -p "$VAR"
  [ -s "$VAR/$1" ] || (umask 077 && "$PYTHON" -c "import secrets; print(secrets.token_hex(24))" >"$VAR/$1")
  cat "$VAR/$1"
}
[ -n "${DATABASE_PASSWORD:-}" ] || DATABASE_PASSWORD="$(secret_in_var database-password)"
export DATABASE_PASSWORD
[ -n "${REDIS_PASSWORD:-}" ] || REDIS_PASSWORD="$(secret_in_var redis-password)"
export REDIS_PASSWORD
export REDISCLI_AUTH="$REDIS_PASSWORD"
export REDIS_URL="${REDIS_URL:-redis://:$REDIS_PASSWORD@127.0.0.1:$REDIS_PORT}"
export MEDIA_ROOT="${MEDIA_ROOT:-$VAR/media}"
export STATIC_ROOT="${STATIC_ROOT:-$VAR/static}"
export WEB_PORT="${WEB_PORT:-8000}"
export WS_PORT="${WS_PORT:-8001}"
# Pages open their websocket on this port of the same host; leave it empty behind a proxy that routes /ws/.
export WS_PUBLIC_PORT="${WS_PUBLIC_PORT-$WS_PORT}"
export WEB_WORKERS="${WEB_WORKERS:-4}"
# The sandbox service (desktops for live annotation and rollouts) and the websockify bridge to their VNC.
export SANDBOX_PORT="${SANDBOX_PORT:-8010}"
export SANDBOX_URL="${SANDBOX_URL:-http://127.0.0.1:$SANDBOX_PORT}"
export SANDBOX_REDIS_URL="${SANDBOX_REDIS_URL:-$REDIS_URL/3}"
export SANDBOX_NAMESPACE="${SANDBOX_NAMESPACE:-sandbox}"
export SANDBOX_WARM="${SANDBOX_WARM:-0}"
# The only directory OSWorld upload_file steps copy host files from (checked at task import and at setup).
export SANDBOX_TASK_FILES="${SANDBOX_TASK_FILES:-$VAR/task-files}"
export VNC_PORT="${VNC_PORT:-6080}"
# The embedded policy server (a local transformers checkpoint behind the OpenAI protocol) for live proposals.
export POLICY_PORT="${POLICY_PORT:-8020}"
export POLICY_URL="${POLICY_URL:-http://127.0.0.1:$POLICY_PORT/v1}"
export WEB_THREADS="${WEB_THREADS:-2}"
export PATH="$VENV/bin:$PATH"

log() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31merror:\033[0m %s\n' "$*" >&2; exit 1; }
