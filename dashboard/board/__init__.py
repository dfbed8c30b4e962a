"""The health board: the page (``page``), what a row reads (``data``), a row as HTML
(``rows``), the push after a poll (``live``) and the websocket (``consumers``). Nothing below
imports it: polling reaches it through the hook ``DashboardConfig.ready`` registers."""
