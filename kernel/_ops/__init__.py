"""The operations a user calls, built from the rooms below: the builder and the frozen
``InstanceSettings`` (``_builder``, ``_settings``), ``Workflow`` and its stream (``_workflow``),
and what works on an instance's log: fork (``_fork``), answering a request (``_respond``),
recovery, replay, rerun, sub-workflows and checkpoint statuses. The top room: imports every
room below; only ``kernel/__init__.py`` imports it."""
