"""A real local HTTP receiver for webhook tests: records each request and answers with the next scripted status."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Receiver:
    url: str
    statuses: list[int] = field(default_factory=list)  # answered in order; 200 once they run out
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, count: int, timeout: float = 60) -> list[tuple[dict[str, str], bytes]]:
        """The first `count` requests, waiting up to `timeout` seconds for them."""
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.requests) >= count, timeout)
        assert len(self.requests) >= count, f"{len(self.requests)} request(s) arrived, expected {count}"
        return self.requests[:count]


@contextmanager
def receiver(statuses: list[int] | None = None) -> Iterator[Receiver]:
    """A ThreadingHTTPServer on a free loopback port for the duration of the block."""
    state = Receiver(url="", statuses=list(statuses or []))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status = state.statuses.pop(0) if state.statuses else 200
            reply = b'{"ok": true}' if status < 300 else b"receiver is down"
            self.send_response(status)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
            with state.arrived:
                state.requests.append((dict(self.headers.items()), body))
                state.arrived.notify_all()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
