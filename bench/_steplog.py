"""The one place that decides whether steplog's runner can be benchmarked yet.

TEMPORARY GUARD: until ``kernel.WorkflowBuilder`` lands, every case that needs the runner reports
"pending: runner not available" instead of failing. Remove ``require_runner`` (and its calls)
once the runner is in ``kernel``: from then on a missing runner must be an error, not a note.
"""

from __future__ import annotations

from types import ModuleType

from bench._core import Pending

__all__ = ["require_projections", "require_runner", "runner_available"]

RUNNER_PENDING = "pending: runner not available (kernel.WorkflowBuilder not importable yet)"


def runner_available() -> bool:
    try:
        from kernel import WorkflowBuilder  # noqa: F401
    except ImportError:
        return False
    return True


def require_runner() -> ModuleType:
    """The module of steplog executors used by the benchmarks (imports the runner's API)."""
    if not runner_available():
        raise Pending(RUNNER_PENDING)
    from bench import _steplog_graphs

    return _steplog_graphs


PROJECTIONS_PENDING = "pending: projections API not available (projections.{name} not importable)"


def require_projections(*names: str) -> ModuleType:
    """The ``projections`` package, once it exports ``names`` (else the case is pending)."""
    try:
        import projections
    except ImportError:
        raise Pending(PROJECTIONS_PENDING.format(name=names[0] if names else "")) from None
    for name in names:
        if not hasattr(projections, name):
            raise Pending(PROJECTIONS_PENDING.format(name=name))
    return projections
