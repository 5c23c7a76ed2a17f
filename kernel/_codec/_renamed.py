"""The names values of the kernel's public classes were stored under before they reported
``kernel`` as their module, and the names they are stored under now.

The value codec stores a class as ``"module:qualname"`` and rebuilds only the classes registered
under that name. Until the kernel's modules moved into subpackages (issue 22), its public classes
reported the private module defining them (``kernel._emit:WorkflowEvent``, inside every stored
sub-workflow request); since, every one reports ``kernel`` (``kernel:WorkflowEvent``), which no
later move changes. ``ValueCodec.decode`` reads a name of the left column as the name on its
right, so logs written before still decode to the same classes. Data only: nothing is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["FORMER_NAMES"]

_MOVED = {
    "kernel._chain": ("ChainHead", "ChainProblem", "ChainReport"),
    "kernel._checkpoints": ("Checkpoint",),
    "kernel._emit": (
        "WorkflowErrorDetails", "WorkflowEvent", "WorkflowEventSource", "WorkflowRunState"
    ),
    "kernel._executor": ("HandlerSpec", "ResponseHandlerSpec", "WorkflowMessage"),
    "kernel._graph": ("Case", "Default"),
    "kernel._lease": ("Lease",),
    "kernel._recovery": ("RecoveredRun",),
    "kernel._rekey": ("RekeyReport",),
    "kernel._requests": ("PendingRequest",),
    "kernel._rerun": ("Divergence", "RerunReport"),
    "kernel._respond": ("RecordedResponse",),
    "kernel._runner": ("RunResult",),
    "kernel._store": ("Recorded",),
}  # fmt: skip
"""The public classes that can be stored as values, by the module they reported before."""

FORMER_NAMES: Mapping[str, str] = MappingProxyType(
    {f"{module}:{name}": f"kernel:{name}" for module, names in _MOVED.items() for name in names}
)
"""A stored ``"module:qualname"`` of before, and the name the same class is registered under."""
