"""Hostile text made safe: plain-text rendering of message bodies and headers (``render``)
and per-channel redaction of payload fields (``redaction``). The bottom of ``dlq``: it imports
no other part of the app, and every part may use it."""
