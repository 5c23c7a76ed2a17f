"""What a workflow is, before it runs: executors and their handlers (``_executor`` and the
modules beside it), the graph of edge groups and its build-time checks (``_graph``), the
definition's view and its AF-shaped dict (``_definition``), its drawing (``_viz``), what a
handler may do in its superstep (``_context``: ``WorkflowContext``, over the protocol a superstep
implements), and recorded steps (``_step``: ``@step``, the identities of its calls, and the
``StepHost`` protocol the runner implements). Imports ``_codec``, ``_log`` and ``_base``; never
the store or the runner."""
