"""What the log says and the one rule for what counts: the events (``_events``: frozen pydantic
models in one union on ``type``), the folds over them (``_fold``: ``CommittedState``, the marker
rule every fold of staged items shares) and the human-input values (``_requests``:
``PendingRequest``, ``Response``). Pure: no I/O, no clock. Imports only ``_base``."""
