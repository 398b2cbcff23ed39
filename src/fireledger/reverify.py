"""Verification that does not lapse silently: the control plane renews it (decisions 0170-0172).

A target's verification lasts ``FIRELEDGER_VERIFICATION_VALIDITY_S`` (30 days, decision 0041).
During its last ``FIRELEDGER_REVERIFY_WINDOW_S`` (7 days) :func:`reverify_pass` proves ownership
again by the method that proved it last (the HTTP challenge or the DNS TXT record), as
``POST /v1/targets/{id}/verify`` would, with the actor :data:`ACTOR`:

* success renews it (``verified``, a new expiry; audited ``target.verify``);
* failure leaves it ``verified`` until its expiry, with ``verification.error`` naming the cause
  (audited ``target.reverify``), and is tried again 1/28 of the window later (every 6 hours);
* a verification that reaches its expiry unrenewed becomes ``lapsed`` (audited ``target.lapse``):
  the dispatch plane then refuses its attempts with a cause starting ``not sent: target verification
  lapsed`` and the history shows a warning.

**Where it runs.** In every process that runs the control role, every
:attr:`~fireledger.verifysettings.VerificationSettings.pass_every_s` (≤ 60 s). However many control
processes (web workers) run, each target is re-verified by one of them: it is taken with a
per-target compare-and-set in the store (:meth:`TrustStore.claim_reverifications`) that also spaces
the tries. The lapse is a compare-and-set too, so two processes never lapse or audit a target twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fireledger.clock import Clock
from fireledger.domain.trust_records import TargetTrust
from fireledger.security.egress import EgressPolicy
from fireledger.security.targets import forget_cached, prove_target
from fireledger.verifysettings import VerificationSettings

log = logging.getLogger("fireledger.reverify")

#: The audit actor of the automatic re-verification and of the lapse.
ACTOR = "fireledger:reverify"
#: At most this many targets are taken per pass, and at most CONCURRENCY challenged at once.
BATCH = 50
CONCURRENCY = 8


async def _renew(store: Any, clock: Clock, t: TargetTrust, vs: VerificationSettings, policy: EgressPolicy,
                 resolver: Any) -> bool:
    """Prove target ``t`` again and record the outcome; True when renewed."""
    method = t.method or "http"
    cause, addresses = await prove_target(store, t.id, t.url or "", t.token, method, policy, resolver=resolver,
                                          nameservers=vs.nameservers)
    now_us = clock.now().latest_us
    if cause is None:
        expires = now_us + int(vs.validity_s * 1_000_000)
        await asyncio.to_thread(store.trust.set_target_verification, t.tenant_id, t.id, "verified", now_us,
                                expires, None, ACTOR, now_us, addresses=addresses, method=method)
        log.info("target %s of tenant %s: verification renewed by %s", t.id, t.tenant_id, method)
    else:
        await asyncio.to_thread(store.trust.note_reverification_failure, t.tenant_id, t.id,
                                f"automatic re-verification failed: {cause}"[:600], ACTOR, now_us)
        log.warning("target %s of tenant %s: automatic re-verification failed (it stays verified until its "
                    "expiry): %s", t.id, t.tenant_id, cause)
    forget_cached(t.id)
    return cause is None


async def reverify_pass(store: Any, clock: Clock, vs: VerificationSettings, *, allow_private: bool = False,
                        resolver: Any = None) -> tuple[int, int, int]:
    """One pass: lapse the verifications past their expiry, then take the targets entering their
    last window (at most :data:`BATCH`) and prove each again. Returns ``(lapsed, renewed, failed)``."""
    now_us = clock.now().latest_us
    lapsed = await asyncio.to_thread(store.trust.lapse_verifications, now_us, ACTOR)
    for t in lapsed:
        forget_cached(t.id)
        log.warning("target %s of tenant %s: its ownership verification lapsed; its fires are not sent until it "
                    "is verified again", t.id, t.tenant_id)
    window_us, retry_us = int(vs.reverify_window_s * 1_000_000), int(vs.retry_s * 1_000_000)
    taken = await asyncio.to_thread(store.trust.claim_reverifications, now_us, now_us + window_us,
                                    now_us + retry_us, BATCH)
    policy = EgressPolicy(allow_private=allow_private)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(t: TargetTrust) -> bool:
        async with gate:
            return await _renew(store, clock, t, vs, policy, resolver)

    results = await asyncio.gather(*(one(t) for t in taken), return_exceptions=True)
    for t, r in zip(taken, results, strict=True):
        if isinstance(r, BaseException):   # its claim holds it until the retry instant; the others are recorded
            log.error("target %s: the renewal could not be recorded: %s", t.id, type(r).__name__)
    renewed = sum(1 for r in results if r is True)
    return len(lapsed), renewed, len(results) - renewed


async def reverify_loop(store: Any, clock: Clock, vs: VerificationSettings, *, allow_private: bool = False,
                        resolver: Any = None) -> None:
    """Run :func:`reverify_pass` every ``vs.pass_every_s`` until cancelled (the control role's job);
    a failed pass is logged and the next one tries again."""
    while True:
        try:
            await reverify_pass(store, clock, vs, allow_private=allow_private, resolver=resolver)
        except Exception:
            log.exception("verification renewal pass failed; will try again")
        await asyncio.sleep(vs.pass_every_s)   # the period of a recurring job, not a wait for a condition


__all__ = ["ACTOR", "reverify_loop", "reverify_pass"]
