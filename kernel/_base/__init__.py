"""The lowest room: what every other room may use and which uses nothing of steplog's. The one
exception tree (``_errors``), the injectable clock and id factories (``_clock``), the limits on
instance ids and state keys (``_ids``) and store URLs with the one password mask (``_urls``).
Imports nothing from kernel."""
