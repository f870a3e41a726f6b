"""Signed outgoing webhooks for platform events, with retries and a delivery log."""
