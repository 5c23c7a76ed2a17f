"""Events and values as bytes, and back, as untrusted input: values as JSON trees (``_values``,
``_valuetypes``, ``_renamed``), the row format (``_rows``), each event's hash (``_hashing``) and
the chain's checks between rows (``_chain``), old schema versions (``_upcast``), the decoding
check of event fields (``_fieldcheck``), seals (``_cipher``), and ``RowMapper``, which builds and
reads a row with all of them (``_mapper``). Decoding never imports or calls anything that was
not registered. Imports ``_log`` and ``_base``."""
