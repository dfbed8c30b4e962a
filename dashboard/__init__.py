"""The web layer every app may use (``http``, ``html``, ``text``, ``templating``, ``proxy``,
``egress``, ``api``, ``roles``, ``admin_text``, API tokens in ``models``, template tags), the
project-level pages (sign-in, health check, API tokens) and, in ``dashboard.board``, the health
board. The project's wiring is ``config``."""
