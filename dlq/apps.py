from __future__ import annotations

from django.apps import AppConfig


class DlqConfig(AppConfig):
    name = "dlq"
    verbose_name = "Dead letters"

    def ready(self) -> None:
        import dlq.models.lookups  # noqa: F401  (registers the ``__any`` lookup)
        from audit.filters import register_related
        from channels_registry.charts import register_event_source
        from channels_registry.polling import register_unresolved_counter
        from dlq import tasks
        from dlq.models import count_unresolved
        from dlq.models.plans import outcome_records
        from dlq.plans import plan_jobs
        from dlq.triage.chart_events import dead_letter_events

        register_unresolved_counter(count_unresolved)
        register_related(outcome_records)
        register_event_source(dead_letter_events)
        plan_jobs.register(
            relay=tasks.run_replay_plan_task.delay, freeze=tasks.freeze_plan_task.delay
        )
