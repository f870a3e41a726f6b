"""Webhook signatures: a known vector (computed with `openssl dgst -sha256 -hmac`), and every way a check fails."""

from __future__ import annotations

from annotation_app.webhooks.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, headers, signature, verify

SECRET, BODY, AT = "whsec_test", b'{"a":1}', 1700000000
# printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac whsec_test
KNOWN = "sha256=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789"


def test_signature_matches_openssl():
    assert signature(SECRET, AT, BODY) == KNOWN


def test_verify_accepts_the_signed_body_within_tolerance():
    assert verify(SECRET, BODY, str(AT), KNOWN, now=AT + 299)


def test_verify_rejects_tampering_wrong_secret_age_and_garbage():
    assert not verify(SECRET, b'{"a":2}', str(AT), KNOWN, now=AT)
    assert not verify("other", BODY, str(AT), KNOWN, now=AT)
    assert not verify(SECRET, BODY, str(AT + 1), KNOWN, now=AT)  # the timestamp is signed too
    assert not verify(SECRET, BODY, str(AT), KNOWN, now=AT + 301)  # a replay after the tolerance
    assert not verify(SECRET, BODY, "yesterday", KNOWN, now=AT)
    assert not verify(SECRET, BODY, str(AT), "", now=AT)


def test_headers_carry_a_signature_that_verifies():
    sent = headers(SECRET, BODY, event="ping", delivery="d-1", timestamp=AT)
    assert sent["X-Webhook-Event"] == "ping" and sent["X-Webhook-Delivery"] == "d-1"
    assert verify(SECRET, BODY, sent[TIMESTAMP_HEADER], sent[SIGNATURE_HEADER], now=AT)
