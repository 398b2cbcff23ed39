"""The trust boundary: the envelope (KEK, tenant data keys, sealed payloads and secrets), derived
keys (importing this package installs the audit chain's key source into the store: decision 0111),
tenancy, egress, target verification and limits."""

from . import derived as _derived  # noqa: F401  (installs the store's audit key source)
