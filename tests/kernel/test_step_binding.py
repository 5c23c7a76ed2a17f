"""A step call's identity: binding plain positional calls without ``Signature.bind`` gives the
same arguments (and so the same identity and digest) as ``bind`` does, for every call shape."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kernel import RunContext, StepWrapper, step


@step
async def none() -> int:
    return 0


@step
async def two(a: int, b: str) -> int:
    return 0


@step
async def defaults(a: int, b: int = 2, c: Any = None) -> int:
    return 0


@step
async def only(a: int, b: int = 5, /) -> int:
    return 0


@step
async def mixed(a: int, *rest: int, k: int = 1) -> int:
    return 0


@step
async def with_ctx(a: int, ctx: RunContext, b: int = 3) -> int:
    return 0


STEPS = [none, two, defaults, only, mixed, with_ctx]

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4) | st.floats(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


def bound(wrapper: StepWrapper[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        arguments, given = wrapper._bound(args, kwargs)
    except TypeError as error:
        return ("refused", str(error))
    return dict(arguments), given


def by_bind(wrapper: StepWrapper[Any]) -> StepWrapper[Any]:
    """``wrapper`` binding every call with ``Signature.bind`` (no fast path)."""
    slow = copy.copy(wrapper)
    slow._positional = None
    return slow


@given(
    st.sampled_from(STEPS),
    st.lists(values, max_size=5).map(tuple),
    st.dictionaries(st.sampled_from(["a", "b", "c", "k"]), values, max_size=2),
)
def test_arguments_are_binds(wrapper: StepWrapper[Any], args: tuple[Any, ...], kwargs: Any) -> None:
    slow = by_bind(wrapper)
    expected = bound(slow, args, kwargs)
    got = bound(wrapper, args, kwargs)
    assert got == expected
    if expected[0] != "refused":  # the same order too: the digest hashes the mapping in order
        assert list(got[0]) == list(expected[0])
        identity = wrapper._identity(got[0], args, kwargs)
        assert identity == slow._identity(expected[0], args, kwargs)


def test_the_fast_path_is_taken_only_for_positional_signatures() -> None:
    shapes = {w.name: w._positional is not None for w in STEPS}
    assert shapes == {
        "none": True,
        "two": True,
        "defaults": True,
        "only": True,
        "mixed": False,
        "with_ctx": True,  # its context is no part of the identity's signature
    }
