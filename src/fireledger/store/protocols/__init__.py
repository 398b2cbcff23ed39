"""The store's five areas as :class:`typing.Protocol` classes, one module each: what every method
guarantees, what zero rows means and which transaction it runs in. The implementations
(``fireledger.store.{registry,timing,dispatch,trust,history}``) satisfy them on both engines;
``tests/contract/test_store_protocols.py`` checks that they do not drift apart."""

from .dispatch import DispatchStore
from .history import HistoryStore
from .registry import RegistryStore
from .timing import TimingStore
from .trust import TrustStore

__all__ = ["DispatchStore", "HistoryStore", "RegistryStore", "TimingStore", "TrustStore"]
