# Shared settings for the project's scripts: paths, ports and the environment the app reads.
# Sourced, not executed. Every value can be overridden from the caller's environment.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VAR="${VAR_DIR:-$ROOT/var}"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

# A second copy of the project on the same machine: give it its own PORT_OFFSET (e.g. 100) and every port below
# moves by it; its data (var/, sessions) is its own already, being under its own checkout.
PORT_OFFSET="${PORT_OFFSET:-0}"
port() { echo $(($1 + PORT_OFFSET)); }
export PGHOST="${PGHOST:-127.0.0.1}"
export PGPORT="${PGPORT:-$(port 54320)}"
export DATABASE_NAME="${DATABASE_NAME:-annotation}"
export DATABASE_USER="${DATABASE_USER:-annotation}"
export REDIS_PORT="${REDIS_PORT:-$(port 63790)}"
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
export WEB_PORT="${WEB_PORT:-$(port 8000)}"
export WS_PORT="${WS_PORT:-$(port 8001)}"
# Pages open their websocket on this port of the same host; leave it empty behind a proxy that routes /ws/.
export WS_PUBLIC_PORT="${WS_PUBLIC_PORT-$WS_PORT}"
export WEB_WORKERS="${WEB_WORKERS:-4}"
# The sandbox service (desktops for live annotation and rollouts) and the websockify bridge to their VNC.
export SANDBOX_PORT="${SANDBOX_PORT:-$(port 8010)}"
# Session homes, one folder per copy of the project (by its sandbox port), so two copies and their crash leftovers
# never share them. Outside the checkout: sessions must not see the project, which their sandbox hides.
export SANDBOX_ROOT="${SANDBOX_ROOT:-/var/tmp/sandbox-sessions-$SANDBOX_PORT}"
export SANDBOX_URL="${SANDBOX_URL:-http://127.0.0.1:$SANDBOX_PORT}"
export SANDBOX_REDIS_URL="${SANDBOX_REDIS_URL:-$REDIS_URL/3}"
export SANDBOX_NAMESPACE="${SANDBOX_NAMESPACE:-sandbox}"
export SANDBOX_WARM="${SANDBOX_WARM:-0}"
# The only directory OSWorld upload_file steps copy host files from (checked at task import and at setup).
export SANDBOX_TASK_FILES="${SANDBOX_TASK_FILES:-$VAR/task-files}"
export VNC_PORT="${VNC_PORT:-$(port 6080)}"
# The embedded policy server (a local transformers checkpoint behind the OpenAI protocol) for live proposals.
export POLICY_PORT="${POLICY_PORT:-$(port 8020)}"
export POLICY_URL="${POLICY_URL:-http://127.0.0.1:$POLICY_PORT/v1}"
export WEB_THREADS="${WEB_THREADS:-2}"
export PATH="$VENV/bin:$PATH"

log() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31merror:\033[0m %s\n' "$*" >&2; exit 1; }
