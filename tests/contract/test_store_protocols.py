"""The store's areas keep to their protocols (decision 0110): every method a protocol names exists on
its implementation with the same parameters (names, kinds, defaults), no implementation grows a
public method its protocol does not state, the ``Store`` exposes exactly the five areas and its
lifecycle, and no area is wide again. A real store on both engines (the shared ``store`` fixture)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from fireledger.store import Store
from fireledger.store.dispatch import SqlDispatch
from fireledger.store.history import SqlHistory
from fireledger.store.protocols import DispatchStore, HistoryStore, RegistryStore, TimingStore, TrustStore
from fireledger.store.registry import SqlRegistry
from fireledger.store.timing import SqlTiming
from fireledger.store.trust import SqlTrust

AREAS: dict[str, tuple[type, type]] = {
    "registry": (RegistryStore, SqlRegistry),
    "timing": (TimingStore, SqlTiming),
    "dispatch": (DispatchStore, SqlDispatch),
    "trust": (TrustStore, SqlTrust),
    "history": (HistoryStore, SqlHistory),
}
#: The Store's own public surface besides the five areas.
LIFECYCLE = {"open", "close", "migrate", "check_schema", "applied_migrations", "schema_version", "engine_name",
             "server_time_us", "engine", "q"}
#: No area may become the wide class again.
MAX_PUBLIC_METHODS = 40


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")} - {"engine", "q"}


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    sig = inspect.signature(fn)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize("area", sorted(AREAS))
def test_each_area_implements_exactly_its_protocol(area: str) -> None:
    proto, impl = AREAS[area]
    stated = _public(proto)
    assert stated, f"{proto.__name__} states no method"
    assert stated - _public(impl) == set(), f"{impl.__name__} lacks protocol methods"
    assert _public(impl) - stated == set(), f"{impl.__name__} has public methods its protocol does not state"
    for name in sorted(stated):
        p_attr, i_attr = inspect.getattr_static(proto, name), inspect.getattr_static(impl, name)
        assert isinstance(p_attr, property) == isinstance(i_attr, property), name
        if isinstance(p_attr, property):
            continue
        assert _params(getattr(proto, name)) == _params(getattr(impl, name)), f"{impl.__name__}.{name} drifted"
        assert inspect.getdoc(getattr(proto, name)), f"{proto.__name__}.{name} states no contract"


@pytest.mark.parametrize("area", sorted(AREAS))
def test_no_area_is_wide(area: str) -> None:
    assert len(_public(AREAS[area][1])) <= MAX_PUBLIC_METHODS


def test_the_store_is_five_areas_and_its_lifecycle(store: Store) -> None:
    surface = {n for n in dir(store) if not n.startswith("_")}
    assert surface == set(AREAS) | LIFECYCLE
    for name, (proto, impl) in AREAS.items():
        part = getattr(store, name)
        assert isinstance(part, impl)
        assert all(callable(getattr(part, m)) or isinstance(inspect.getattr_static(impl, m), property)
                   for m in _public(proto))


def test_the_areas_share_one_engine_and_one_audit_chain(store: Store) -> None:
    """Composition: one engine under every area; the areas that audit their acts write through the
    trust area's chain (an audited registry act advances the same head the trust area reads)."""
    from storekit import add_tenant

    assert {id(getattr(store, a).engine) for a in AREAS} == {id(store.engine)}
    head, _ = store.trust.audit_head()
    tenant = add_tenant(store)
    store.dispatch.set_tenant_quota(tenant.id, fires_per_s=5.0, actor="pr_test", now_us=1)
    seq, _ = store.trust.audit_head()
    rows = store.trust.audit_rows(after_seq=head)
    assert seq == head + len(rows) and rows[-1].action == "tenant.quota"
