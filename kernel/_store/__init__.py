"""The event store: the port an adapter implements (``_backend``: ``RowBackend``, and the error
edge), ``EventStore`` built on it (``_eventstore``, with ``_core``, ``_marks``, ``_reads``,
``_scan``, ``_verify`` and ``_records``), group commit (``_group``), leases and run owners
(``_lease``, ``_owner``), the adapters (``_memory``; ``_sqlite`` with ``_sqlitefile`` and
``_sqliterecorder``; ``_postgres`` with ``_pgrecorder``), ``open_store`` above them, importing
each lazily (``_factory``), and maintenance through the port (``_rekey``). Imports ``_codec``,
``_log`` and ``_base``."""
