#!/usr/bin/env python3
"""Load benchmark of the annotators' task queue: the queue page and the 'next task' API under wrk.

What it does, end to end (see bench/README.md):
  1. creates the database `annotation_bench` if missing, migrates it and seeds it (manage.py seed_bench: 100,000
     tasks, 10,000 trajectories with steps, 50 annotators with API tokens and login sessions);
  2. for each server (gunicorn as `scripts/run` runs it, and daphne alone as the baseline), starts it on a free
     loopback port against that database, with DEBUG off;
  3. warms up, then runs wrk (`-c 50 -t 2 --latency`) for each scenario: /healthz (the baseline floor of the
     same server: one `select 1`), the queue page, 'next task' answering the current assignment, and 'next task'
     skipping the current assignment and claiming a new one (SELECT ... FOR UPDATE SKIP LOCKED);
  4. prints a markdown table (req/s, p50/p90/p99, non-2xx, ratios against daphne on the same scenario) and
     whether each scenario meets the goal p99 <= 100 ms, and saves it to bench/results/queue_load.md;
  5. stops each server, also on errors and Ctrl-C.

Usage (after `scripts/services start`): .venv/bin/python bench/queue_load.py [--duration 15s] [--skip-seed]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "bench"
RESULTS_DIR = BENCH_DIR / "results"
LUA_SCRIPT = BENCH_DIR / "lua" / "scenario.lua"
BENCH_DB = "annotation_bench"
GOAL_P99_MS = 100.0
NON2XX_ALARM = 0.01  # more than 1% non-2xx answers make a scenario's figures worthless


@dataclass(frozen=True)
class Scenario:
    name: str
    label: str
    method: str
    path: str
    body: str | None
    auth: str  # none | cookie | token


SCENARIOS = [
    Scenario("healthz", "GET /healthz (baseline: select 1)", "GET", "/healthz", None, "none"),
    Scenario("queue_page", "GET /annotate/ (queue page, session cookie)", "GET", "/annotate/", None, "cookie"),
    Scenario(
        "next_current", "POST /api/queue/next/ {} (current assignment)", "POST", "/api/queue/next/", "{}", "token"
    ),
    Scenario(
        "next_skip",
        'POST /api/queue/next/ {"skip_current": true} (release + claim)',
        "POST",
        "/api/queue/next/",
        '{"skip_current": true}',
        "token",
    ),
]


class BenchError(Exception):
    pass


def log(message: str) -> None:
    print(f"\033[1;34m==>\033[0m {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    bar = "!" * 100
    print(f"\n\033[1;31m{bar}\n!!! {message}\n{bar}\033[0m\n", file=sys.stderr, flush=True)


# --- environment, database, data ----------------------------------------------------------------------------------


def project_env() -> dict[str, str]:
    """The environment scripts/env.sh gives the app, pointed at the bench database, with DEBUG off."""
    out = subprocess.run(
        ["bash", "-c", "source scripts/env.sh >/dev/null && env -0"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    env.update(
        DATABASE_NAME=BENCH_DB,
        DJANGO_DEBUG="0",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        # DEBUG off serves static files through the manifest: collect them here, not into the project's var/static.
        STATIC_ROOT=str(RESULTS_DIR / "static"),
        DJANGO_SETTINGS_MODULE=os.environ.get("DJANGO_SETTINGS_MODULE") or "annotation_app.settings",
        PYTHONUNBUFFERED="1",
    )
    # The venv's python runs this script; make sure its daphne and manage.py come first.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(cmd: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess:
    log(" ".join(cmd))
    return subprocess.run(cmd, cwd=ROOT, env=env, check=True, **kwargs)


def manage(env: dict[str, str], *args: str) -> None:
    run([sys.executable, "manage.py", *args], env)


def ensure_database(env: dict[str, str]) -> None:
    psql_env = {**env, "PGPASSWORD": env["DATABASE_PASSWORD"]}
    psql = ["psql", "-h", "127.0.0.1", "-p", env["PGPORT"], "-U", env["DATABASE_USER"], "-d", "postgres"]
    psql += ["-v", "ON_ERROR_STOP=1", "-qtA"]
    exists = subprocess.run(
        [*psql, "-c", f"select 1 from pg_database where datname = '{BENCH_DB}'"],
        env=psql_env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if exists != "1":
        log(f"creating database {BENCH_DB}")
        subprocess.run([*psql, "-c", f'create database "{BENCH_DB}"'], env=psql_env, check=True)


def prepare_data(env: dict[str, str], args: argparse.Namespace, credentials: Path) -> dict[str, Any]:
    ensure_database(env)
    seed = ["seed_bench", "--annotators", str(args.annotators), "--credentials-out", str(credentials)]
    seed.append("--reset-queue")  # every run starts from the same queue state
    if args.skip_seed:
        manage(env, *seed, "--users-only")
    else:
        manage(env, "migrate", "--noinput", "-v", "0")
        manage(env, *seed, "--tasks", str(args.tasks), "--trajectories", str(args.trajectories))
    manage(env, "collectstatic", "--noinput", "-v", "0")
    data = json.loads(credentials.read_text())
    if not data["annotators"]:
        raise BenchError("seed_bench made no annotators")
    return data


def write_lua_credentials(data: dict[str, Any], path: Path) -> None:
    path.write_text("".join(f"{a['token']}\t{a['session_key']}\n" for a in data["annotators"]))
    path.chmod(0o600)


# --- the server -----------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(name: str, port: int, env: dict[str, str]) -> list[str]:
    """The HTTP server as the Procfile runs it (gunicorn), or daphne serving HTTP alone (the baseline)."""
    if name == "gunicorn":
        return [
            "gunicorn", "annotation_app.wsgi:application", "--bind", f"127.0.0.1:{port}", "--worker-class", "gthread",
            "--workers", env.get("WEB_WORKERS", "4"), "--threads", env.get("WEB_THREADS", "2"),
        ]  # fmt: skip
    if name == "daphne":
        return ["daphne", "-b", "127.0.0.1", "-p", str(port), "annotation_app.asgi:application"]
    raise BenchError(f"unknown server {name!r}; use gunicorn or daphne")


class Server:
    """An HTTP server in its own process group, so that stopping it stops every worker it started."""

    def __init__(self, name: str, env: dict[str, str], port: int, log_path: Path) -> None:
        self.name, self.env, self.port, self.log_path = name, env, port, log_path
        self.proc: subprocess.Popen | None = None
        self.base_url = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        cmd = server_command(self.name, self.port, self.env)
        executable = shutil.which(cmd[0], path=self.env["PATH"])
        if executable is None:
            raise BenchError(f"{cmd[0]} not found in the virtualenv")
        cmd[0] = executable
        log(" ".join(cmd) + f"  (log: {self.log_path.relative_to(ROOT)})")
        self.log_file = self.log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=self.env, stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited early; its log:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        raise BenchError(f"{self.name} did not answer /healthz within {timeout:.0f} s; its log:\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """User + system CPU time so far of every live process in the server's process group (its workers too)."""
        if self.proc is None:
            return 0.0
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid:  # the process group
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        log(f"stopping {self.name} (pid {self.proc.pid})")
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        self.log_file.close()


# --- requests and wrk -----------------------------------------------------------------------------------------------


def one_request(server: Server, scenario: Scenario, annotator: dict[str, Any], cookie_name: str) -> tuple[int, str]:
    """One request of the scenario with urllib: (status, the body's beginning)."""
    headers = {"Host": f"127.0.0.1:{server.port}"}
    data = scenario.body.encode() if scenario.body is not None else None
    if data is not None:
        headers["Content-Type"] = "application/json"
    if scenario.auth == "cookie":
        headers["Cookie"] = f"{cookie_name}={annotator['session_key']}"
    elif scenario.auth == "token":
        headers["Authorization"] = f"Token {annotator['token']}"

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # a redirect (e.g. to the login page) is an answer to report, not to follow

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(
        server.base_url + scenario.path, data=data, headers=headers, method=scenario.method
    )
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.read(600).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        location = exc.headers.get("Location")
        body = exc.read(600).decode(errors="replace")
        return exc.code, (f"(Location: {location}) " if location else "") + body


def wrk(
    server: Server, scenario: Scenario, args: argparse.Namespace, duration: str, credentials_tsv: Path, cookie: str
) -> tuple[dict[str, Any], str]:
    env = {
        **os.environ,
        "BENCH_METHOD": scenario.method,
        "BENCH_BODY": scenario.body or "",
        "BENCH_AUTH": scenario.auth,
        "BENCH_CREDENTIALS": str(credentials_tsv),
        "BENCH_COOKIE_NAME": cookie,
        "BENCH_THREADS": str(args.threads),
    }
    cmd = ["wrk", "-c", str(args.connections), "-t", str(args.threads), "-d", duration, "--latency"]
    cmd += ["--timeout", args.timeout, "-s", str(LUA_SCRIPT), server.base_url + scenario.path]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise BenchError(f"wrk failed ({proc.returncode}) for {scenario.name}:\n{output}")
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            return json.loads(line.removeprefix("BENCH_JSON ")), output
    raise BenchError(f"wrk printed no BENCH_JSON line for {scenario.name}:\n{output}")


# --- report ---------------------------------------------------------------------------------------------------------


def fmt_ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "n/a"


def render_table(rows: list[dict[str, Any]], baseline: str) -> str:
    """One row per server and scenario; ratios compare with the baseline server on the same scenario."""
    base = {row["scenario"].name: row["result"] for row in rows if row["server"] == baseline}
    header = (
        f"| server | scenario | req/s | p50 ms | p90 ms | p99 ms | non-2xx | socket errors | req/s vs {baseline} "
        f"| p99 vs {baseline} | server CPU | p99 <= 100 ms |"
    )
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for row in rows:
        r, b = row["result"], base.get(row["scenario"].name)
        errors = sum(r["errors"][k] for k in ("connect", "read", "write", "timeout"))
        non2xx = f"{r['non2xx']}" + (f" ({r['non2xx'] / r['requests']:.1%})" if r["non2xx"] else "")
        lines.append(
            f"| {row['server']} | {row['scenario'].label} | {r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} "
            f"| {r['p99_ms']:.1f} | {non2xx} | {errors} | {fmt_ratio(r['rps'], b['rps']) if b else 'n/a'} "
            f"| {fmt_ratio(r['p99_ms'], b['p99_ms']) if b else 'n/a'} "
            f"| {row['cpu']:.0%} | {'yes' if r['p99_ms'] <= GOAL_P99_MS else '**NO**'} |"
        )
    return "\n".join(lines)


def measure_server(
    name: str, env: dict[str, str], args: argparse.Namespace, data: dict[str, Any], credentials_tsv: Path
) -> list[dict[str, Any]]:
    """Start one server, check and warm up every scenario, measure each, stop the server."""
    cookie, first = data["session_cookie_name"], data["annotators"][0]
    server = Server(name, env, args.port or free_port(), RESULTS_DIR / f"{name}.log")
    rows = []
    try:
        server.start()
        server.wait_ready()
        log(f"{name} answers on {server.base_url}")
        for scenario in SCENARIOS:
            status, body = one_request(server, scenario, first, cookie)
            log(f"pre-flight {scenario.name}: HTTP {status}")
            if not 200 <= status < 300:
                warn(f"pre-flight of {scenario.name} ({scenario.label}) answered HTTP {status}:\n{body}")
        log(f"warm-up: {args.warmup} per scenario")
        for scenario in SCENARIOS:
            wrk(server, scenario, args, args.warmup, credentials_tsv, cookie)
        for scenario in SCENARIOS:
            log(f"measuring {name} {scenario.name}: wrk -c {args.connections} -t {args.threads} -d {args.duration}")
            cpu_before, wall_before = server.cpu_seconds(), time.monotonic()
            result, output = wrk(server, scenario, args, args.duration, credentials_tsv, cookie)
            cpu = (server.cpu_seconds() - cpu_before) / (time.monotonic() - wall_before)
            (RESULTS_DIR / f"wrk-{name}-{scenario.name}.txt").write_text(output)
            rows.append({"server": name, "scenario": scenario, "result": result, "cpu": cpu})
            print(
                f"    {name} {scenario.name}: {result['rps']:.1f} req/s, p50 {result['p50_ms']:.1f} ms, "
                f"p99 {result['p99_ms']:.1f} ms, non-2xx {result['non2xx']}",
                file=sys.stderr,
                flush=True,
            )
            if result["requests"] == 0 or result["non2xx"] > NON2XX_ALARM * result["requests"]:
                status, body = one_request(server, scenario, first, cookie)
                warn(
                    f"{name} {scenario.name}: {result['non2xx']} of {result['requests']} answers were not 2xx "
                    f"(first seen by wrk: HTTP {result['first_non2xx_status']} {result['first_non2xx_body']!r}); "
                    f"its figures are worthless.\nRepeating one request now: HTTP {status}\n{body}"
                )
            if server.proc is not None and server.proc.poll() is not None:
                raise BenchError(f"{name} died; its log:\n{server.log_tail()}")
    finally:
        server.stop()
    return rows


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        return out.stdout.strip() + ("+dirty" if dirty.strip() else "")
    except OSError:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", default="15s", help="wrk -d per scenario (default 15s)")
    parser.add_argument("--warmup", default="3s", help="wrk -d of the warm-up run of each scenario (default 3s)")
    parser.add_argument("--connections", type=int, default=50, help="wrk -c (default 50)")
    parser.add_argument("--threads", type=int, default=2, help="wrk -t (default 2)")
    parser.add_argument("--timeout", default="10s", help="wrk --timeout (default 10s)")
    parser.add_argument("--skip-seed", action="store_true", help="reuse the bench database as it is (no migrate/seed)")
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--annotators", type=int, default=50, help="default 50: one per connection")
    parser.add_argument(
        "--servers",
        default="gunicorn,daphne",
        help="HTTP servers to measure, in order; the last is the baseline of the ratios (default gunicorn,daphne)",
    )
    parser.add_argument("--port", type=int, default=0, help="the servers' port (default: a free one)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "queue_load.md")
    args = parser.parse_args()

    for tool in ("wrk", "psql"):
        if shutil.which(tool) is None:
            raise BenchError(f"{tool} not found (apt-get install -y {'wrk' if tool == 'wrk' else 'postgresql-client'})")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    env = project_env()
    credentials = RESULTS_DIR / "credentials.json"
    data = prepare_data(env, args, credentials)
    credentials_tsv = RESULTS_DIR / "credentials.tsv"
    write_lua_credentials(data, credentials_tsv)
    servers = [name.strip() for name in args.servers.split(",") if name.strip()]

    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    for name in servers:
        if name != servers[0]:
            # Every server starts from the same queue state: one active task per annotator, nothing skipped.
            manage(env, "seed_bench", "--users-only", "--reset-queue", "--annotators", str(args.annotators),
                   "--credentials-out", str(credentials))  # fmt: skip
            data = json.loads(credentials.read_text())
            write_lua_credentials(data, credentials_tsv)
        rows += measure_server(name, env, args, data, credentials_tsv)
    load_after = os.getloadavg()[0]

    counts = data["counts"]
    described = ", ".join(
        f"`{' '.join(server_command(n, 0, env)).replace(' --bind 127.0.0.1:0', '')}`" for n in servers
    )
    table = render_table(rows, baseline=servers[-1])
    failing = [f"{row['server']} {row['scenario'].name}" for row in rows if row["result"]["p99_ms"] > GOAL_P99_MS]
    bad = [
        f"{row['server']} {row['scenario'].name}"
        for row in rows
        if row["result"]["non2xx"] > NON2XX_ALARM * row["result"]["requests"]
    ]
    verdict = (
        f"Goal p99 <= {GOAL_P99_MS:.0f} ms: "
        + ("met by every scenario." if not failing else f"NOT met by {', '.join(failing)}.")
        + (f" WARNING: over 1% non-2xx in {', '.join(bad)}; those figures are worthless." if bad else "")
    )
    report = "\n".join(
        [
            "# Task-queue load benchmark",
            "",
            f"- when: {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC; commit {git_commit()}",
            f"- machine: {platform.node()}, {os.cpu_count()} CPU cores, {platform.platform()}; "
            f"1-min load average {load_before:.2f} before the measured runs, {load_after:.2f} after "
            "(server, PostgreSQL and wrk share these cores: other work on the machine skews the figures)",
            f"- servers: {described} "
            f"(baseline: {servers[-1]}), on loopback, DEBUG off, database `{BENCH_DB}` "
            f"({', '.join(f'{n} {name}' for name, n in counts.items())})",
            f"- load: `wrk -c {args.connections} -t {args.threads} -d {args.duration} --latency` per scenario, "
            f"after a {args.warmup} warm-up of each; each wrk thread cycles through its share of the "
            f"{len(data['annotators'])} annotators",
            "- server CPU: CPU time of the server's processes over the run's wall time (100% = one core)",
            "",
            table,
            "",
            verdict,
            "",
        ]
    )
    print()
    print(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report)
    log(f"saved to {args.output}")
    return 1 if bad else 0


def _terminate(signum: int, frame: object) -> None:
    # A TERM (e.g. from a CI timeout) unwinds like Ctrl-C, so that daphne is stopped on the way out.
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"\033[1;31merror:\033[0m {exc}", file=sys.stderr)
        sys.exit(2)
    except subprocess.CalledProcessError as exc:
        print(
            f"\033[1;31merror:\033[0m {' '.join(map(str, exc.cmd))} failed with status {exc.returncode}",
            file=sys.stderr,
        )
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
