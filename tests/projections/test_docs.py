"""The examples in docs/projections.md run, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "projections.md"


def test_the_examples_in_the_projections_guide_run():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 8
    namespace: dict[str, object] = {}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"{DOC.name}[example {number}]", "exec"), namespace)


def test_the_public_names_are_exported():
    import projections

    assert sorted(projections.__all__) == sorted(set(projections.__all__))
    for name in projections.__all__:
        assert hasattr(projections, name), name
    from kernel._fold import fold_committed

    assert projections.fold_committed is fold_committed
