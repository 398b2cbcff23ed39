"""An HTTP attempt's request: admitted, body and token built, signed (decision 0242: done as the
attempt is claimed when admission needs no store read, so a held attempt is written the moment a
connection of its flow is free).

:func:`build_request` — the signed request of an admitted attempt, or the final ``failed`` result
of one that cannot be built (recorded with its cause, never looped). :func:`prepared` — the same
after :func:`~fireledger.security.targets.admit_now`, or None when admission must read the store.
"""

from __future__ import annotations

import math

from fireledger.domain.model import DispatchJob
from fireledger.security.targets import admit_now
from fireledger.store import Store

from .credentials import KeyRingFile, authorization_header, body_sha256, mint
from .http import HttpRequest, HttpResult
from .settling import dispatch_body

__all__ = ["build_request", "prepared"]


def build_request(job: DispatchJob, key: str, now_s: int, keys: KeyRingFile | None,
                  issuer: str) -> HttpRequest | HttpResult:
    """The signed request of the admitted HTTP attempt ``job`` (fire key ``key``) at ``now_s``,
    with a per-attempt token when ``keys`` is given (ADR-14), or the final result of one that cannot be built."""
    f = job.fire
    target = job.target
    try:
        if target.url is None:
            raise ValueError("the target has no URL")
        body = dispatch_body(job, key)
        headers: dict[str, str] = {}
        if keys is not None:
            # A credential that lives as long as this attempt (ADR-14).
            token = mint(keys.ring(max_age_s=1.0), issuer=issuer, audience=target.url,
                         subject=f.trigger_id, fire_key=key, attempt=job.attempt,
                         body_sha256=body_sha256(body), now_s=now_s,
                         expires_s=now_s + math.ceil(job.policies.timeout_s) + 1)
            headers = authorization_header(token)
        return HttpRequest(url=target.url, secret=target.secret, fire_key=key,
                           msg_id=f"{key}.{job.attempt}", timestamp=now_s, body=body,
                           timeout_s=job.policies.timeout_s, extra_headers=headers,
                           pinned_addresses=job.pinned_addresses, tenant_id=f.tenant_id)
    except ValueError as exc:
        # A definition that cannot be sent is final, recorded with its cause (never looped).
        return HttpResult("failed", None, f"cannot build the request: {exc}", 0.0)


def prepared(store: Store, job: DispatchJob, key: str, now_us: int, keys: KeyRingFile | None,
             issuer: str) -> HttpRequest | HttpResult | None:
    """The HTTP attempt ``job`` admitted and its request built now, when admission needs no store
    read: the request, or the final result of one that must not or cannot be sent; None when
    admission must read the store (the attempt's task then admits it with ``admit``)."""
    got = admit_now(store, job, now_us)
    if got is None:
        return None
    admitted, refused = got
    if refused is not None:
        return HttpResult("failed", None, refused, 0.0)
    return build_request(admitted, key, now_us // 1_000_000, keys, issuer)
