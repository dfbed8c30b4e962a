from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Health board"

    def ready(self) -> None:
        from channels_registry.polling import register_board_push
        from channels_registry.views import register_board_row
        from dashboard import api_schema, receivers
        from dashboard.board import live, page

        _ = api_schema  # registers the bearer scheme with drf-spectacular
        _ = receivers  # revokes a user's API tokens on deactivation or a new password

        # Polling (a lower layer) tells the live board what changed through this hook. Looked
        # up at each call, so a replaced ``live.push_board_rows`` (bench/live.py) is the one run.
        register_board_push(lambda ids, sampled: live.push_board_rows(ids, sampled))
        # The channel page shows the board's row for its channel.
        register_board_row(page.make_row)
