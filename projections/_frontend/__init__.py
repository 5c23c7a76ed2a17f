"""What both front ends (``projections.cli`` and ``projections.ui``) share: text made safe for a
terminal or a page (``_safe``), answers rendered as tables and text (``_render``), a run's
recorded steps read, redacted and said as text (``_steps``), and reading what a person typed:
points (``_points``) and ids shortened to a unique prefix (``_ids``). It may import ``kernel``,
``projections``' folds and views; never cli or ui."""
