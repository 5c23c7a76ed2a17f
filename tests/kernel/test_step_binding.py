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


def by_bind(wrapper: StepWrapper[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The identity as ``Signature.bind`` makes it (what ``_arguments`` must agree with)."""
    try:
        bound = wrapper._identity_signature.bind(*args, **kwargs)
    except TypeError as error:
        return ("refused", str(error))
    bound.apply_defaults()
    return dict(bound.arguments)


def by_wrapper(wrapper: StepWrapper[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return wrapper._arguments(args, kwargs)
    except TypeError as error:
        return ("refused", str(error))


@given(
    st.sampled_from(STEPS),
    st.lists(values, max_size=5).map(tuple),
    st.dictionaries(st.sampled_from(["a", "b", "c", "k"]), values, max_size=2),
)
def test_arguments_are_binds(wrapper: StepWrapper[Any], args: tuple[Any, ...], kwargs: Any) -> None:
    expected = by_bind(wrapper, args, kwargs)
    got = by_wrapper(wrapper, args, kwargs)
    assert got == expected
    if isinstance(expected, dict):  # the same order too: the digest hashes the mapping in order
        assert list(got) == list(expected)
        by_bind_only = copy.copy(wrapper)
        by_bind_only._positional = None
        assert wrapper._identity(args, kwargs) == by_bind_only._identity(args, kwargs)


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
