"""Capture: dead letters moved from the brokers into the database, exactly once (``ingest``,
``ingest_build``, ``message``, ``fingerprint``), the text filter's index (``search``), the
table's partitions and retention (``partitions``, ``retention``), and the groups' hourly
trend (``trends``). Imports ``dlq.models`` and ``dlq.text`` only."""
