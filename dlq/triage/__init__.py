"""Triage: what a reviewer reads — the failure groups and the entry list (``views``,
``entries_html``, ``groups_html``), the one definition of "which entries" (``filters``), the
read API (``api``), per-object access (``access``) and the channel chart's marks
(``chart_events``). Imports capture, models and text; never plans."""
