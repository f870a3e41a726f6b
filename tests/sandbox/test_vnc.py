"""VNC through the real websockify process: a token per lease and user, Origin checked, dead with the lease."""

import time

import pytest
from websockets.exceptions import InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

from sandbox.desktop import available
from sandbox.vnc import mint_token, revoke_tokens

pytestmark = pytest.mark.skipif(not available(), reason="needs Xvfb, openbox and x11vnc")
ORIGIN = "http://127.0.0.1:8000"


@pytest.fixture
def bridge(bridge_for):
    b = bridge_for(ORIGIN)
    return b.url, b.store, b.session_id, b.vnc_socket


def _rfb_banner(url: str, origin: str) -> bytes:
    """The first bytes the VNC server sends through the bridge, as a browser at `origin` would receive them."""
    with connect(url, origin=origin, subprotocols=["binary"], open_timeout=10) as ws:
        return ws.recv(timeout=10)


def test_a_token_opens_its_session_until_the_lease_ends(bridge):
    url, store, session_id, socket_path = bridge
    token = mint_token(store, session_id, "annotation-app", "user:7", socket_path, ttl_s=30)
    assert len(token) >= 40
    assert _rfb_banner(f"{url}?token={token}", ORIGIN).startswith(b"RFB ")
    with pytest.raises(InvalidStatus, match="403"):  # another site's page
        _rfb_banner(f"{url}?token={token}", "http://evil.example")
    with pytest.raises(InvalidHandshake):  # websockify hangs up on unknown tokens
        _rfb_banner(f"{url}?token=not-a-token", ORIGIN)
    store.release(session_id, "annotation-app")
    with pytest.raises(InvalidHandshake):  # the lease ended: the same token is dead
        _rfb_banner(f"{url}?token={token}", ORIGIN)
    assert revoke_tokens(store, session_id) == 1


def test_only_the_lease_holder_mints_tokens(bridge):
    _, store, session_id, socket_path = bridge
    with pytest.raises(PermissionError):
        mint_token(store, session_id, "someone-else", "user:8", socket_path, ttl_s=30)


def test_a_token_dies_when_its_lease_expires(bridge):
    url, store, session_id, socket_path = bridge
    store.release(session_id, "annotation-app")
    short = store.acquire("annotation-app", ttl_s=0.5, session_id=session_id)
    token = mint_token(store, short.session_id, "annotation-app", "user:7", socket_path, ttl_s=60)
    assert _rfb_banner(f"{url}?token={token}", ORIGIN).startswith(b"RFB ")
    time.sleep(0.7)  # the lease expires; the token's own TTL (60 s) has not
    with pytest.raises(InvalidHandshake):
        _rfb_banner(f"{url}?token={token}", ORIGIN)
