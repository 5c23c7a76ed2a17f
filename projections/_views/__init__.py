"""The materialized views and their tables: the view-table port and the memory backend
(``_backends``), the SQL backends in the store's own database (``_sqlbackends``, ``_sqlite``,
``_postgres``, ``_backend_for``), sealed documents (``_docseal``, ``_reseal``), manifests,
the view specs, snapshots, key blame from the index, and ``Projector`` (``_projector``). Imports
``kernel`` and ``_folds``."""
