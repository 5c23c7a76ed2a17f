"""The mapper is built once, whole: its keys and its broken-chain policy never change after."""

from __future__ import annotations

import pytest

from kernel import Keyring, open_store
from kernel._codec._mapper import RowMapper
from kernel._codec._upcast import KERNEL_UPCASTERS


def test_a_mapper_cannot_be_changed_after_it_is_built() -> None:
    keys = Keyring.from_text(Keyring.generate())
    mapper = RowMapper(keyring=keys)
    assert mapper.keyring is keys
    with pytest.raises(AttributeError):
        mapper.keyring = None  # type: ignore[misc]
    with pytest.raises(AttributeError):
        mapper.on_broken = print  # type: ignore[misc]
    assert mapper.keyring is keys


def test_a_mapper_applies_steplogs_upcasters_before_the_ones_it_is_given() -> None:
    def mine(payload: dict[str, object]) -> dict[str, object]:
        return payload

    mapper = RowMapper({("run_started", 1): mine})
    assert mapper.upcasters[("run_started", 1)] is mine
    assert RowMapper().upcasters == KERNEL_UPCASTERS


@pytest.mark.parametrize("broken", [False, True])
def test_a_store_builds_its_mapper_with_its_keys_and_policy(broken: bool) -> None:
    keys = Keyring.from_text(Keyring.generate())
    with open_store("memory://", keyring=keys, allow_broken_chain=broken) as store:
        assert store._mapper.keyring is keys
        assert store.keyring is keys
        assert (store._mapper.on_broken is not None) is broken
    with open_store("memory://", keyring=None) as store:
        assert store._mapper.keyring is None
        assert store._mapper.on_broken is None
