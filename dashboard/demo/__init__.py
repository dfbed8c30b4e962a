"""Demo traffic: ``manage.py demo`` declares demo channels on the reachable brokers, creates
their topology and runs reference producers and consumers against them (see docs/demo.md).

- ``topology``: detection, names, the demo contracts, broker topology, declarations.
- ``producers``: the order mix (valid, poison, permanent, transient, budget-exhausting,
  duplicates) and one confirmed publisher per broker.
- ``consumers``: the reference consumer (DOMAIN.md's discipline, broker-neutral) and how each
  broker settles its decisions.
- ``runner``: threads, pacing, in-process poll + ingest, clean shutdown and the summary.

Nothing here is used by the product itself; it exists to exercise it.
"""
