"""Plans: bulk replay and discard — preview, freeze, the plan's state (``plan_state``, the
only writer of a plan's status), what runs it (``plan_jobs``, ``discard``, the ``relay_*``
modules), and its pages and API. The top of ``dlq``: it may import triage, capture, models and
text; none of them imports it."""
