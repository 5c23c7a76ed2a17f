"""The pure folds of ``projections``, no I/O: what each event did, as the kernel's fold decides
(``_tracker``), run history and its records (``_history``, ``_runrecords``), lineage across
instances (``_lineage``), blame, the key index, time travel, diffs, bisect, recorded steps beside
their supersteps' verdicts (``_steps``) and the sensitive-key rule (``_redact``). Imports
``kernel`` only."""
