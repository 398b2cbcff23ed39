"""Per-attempt credential cost on the dispatch hot path: Standard Webhooks HMAC vs. the EdDSA JWT.

Prints one JSON object: sign_hmac_us (median µs per ``signing.sign`` of a 300-byte body),
mint_jwt_us (median µs per ``credentials.mint``, body hash included), per_attempt_us (their sum),
tokens_per_s_one_core (1e6 / per_attempt_us), and for reference verify_us (median µs per
``Receiver.verify`` of a full request on the tenant side, token included).

    .venv/bin/python bench/credentials.py [--rounds 15] [--batch 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

from fireledger.dispatch import signing
from fireledger.dispatch.credentials import KeyRing, authorization_header, body_sha256, mint
from fireledger.receiver import Receiver

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NOW = 1_900_000_000


def median_us(fn: Callable[[int], object], rounds: int, batch: int) -> float:
    fn(0)  # warm up
    per_call: list[float] = []
    for r in range(rounds):
        start = time.perf_counter()
        for i in range(batch):
            fn(i + r * batch)
        per_call.append((time.perf_counter() - start) / batch * 1e6)
    return statistics.median(per_call)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch", type=int, default=2000)
    args = ap.parse_args()

    fire_key = "tn_0123456789abcdef.tr_0123456789abcdef.20300101T090000Z.0"
    body = json.dumps({
        "fire_key": fire_key, "trigger_id": "tr_0123456789abcdef",
        "scheduled_instant": "2030-01-01T09:00:00Z", "attempt": 1, "lane": "on_time", "kind": "scheduled",
        "version": 1, "payload": {"note": "x" * 64},
    }, separators=(",", ":")).encode()
    body = (body + b" " * 300)[:300] if len(body) < 300 else body[:300]
    ring = KeyRing.generate()
    url = "https://hooks.example.com/fireledger/endpoint"
    issuer = "https://fireledger.example.com"

    def hmac_once(i: int) -> object:
        return signing.sign(SECRET, f"{fire_key}.{i}", NOW, body)

    def mint_once(i: int) -> object:
        return mint(ring, issuer=issuer, audience=url, subject="tr_0123456789abcdef", fire_key=fire_key,
                    attempt=i, body_sha256=body_sha256(body), now_s=NOW, expires_s=NOW + 30)

    sign_us = median_us(hmac_once, args.rounds, args.batch)
    mint_us = median_us(mint_once, args.rounds, args.batch)

    # Tenant side, for reference: a full verify (HMAC + JWT + body + dedupe) of a real request.
    real_body = json.dumps({
        "fire_key": fire_key, "trigger_id": "tr_0123456789abcdef", "scheduled_instant": "2030-01-01T09:00:00Z",
        "attempt": 1, "lane": "on_time", "kind": "scheduled", "version": 1, "payload": {},
    }).encode()
    token = mint(ring, issuer=issuer, audience=url, subject="tr_0123456789abcdef", fire_key=fire_key, attempt=1,
                 body_sha256=body_sha256(real_body), now_s=NOW, expires_s=NOW + 30)
    headers = {"fireledger-fire-key": fire_key, **signing.build_headers(SECRET, f"{fire_key}.1", NOW, real_body),
               **authorization_header(token)}

    class NoDedupe:
        def seen(self, fire_key: str) -> bool:
            return False

    receiver = Receiver(SECRET, audience=url, issuer=issuer, jwks=ring.jwks(), dedupe=NoDedupe())
    verify_us = median_us(lambda i: receiver.verify(headers, real_body, now=NOW + 1), max(3, args.rounds // 3),
                          max(100, args.batch // 4))

    per_attempt = sign_us + mint_us
    print(json.dumps({
        "scenario": "dispatch-credentials",
        "system": f"python {os.sys.version.split()[0]}, {os.cpu_count()} cpu",
        "sign_hmac_us": round(sign_us, 2),
        "mint_jwt_us": round(mint_us, 2),
        "per_attempt_us": round(per_attempt, 2),
        "tokens_per_s_one_core": round(1e6 / per_attempt),
        "verify_us": round(verify_us, 2),
    }))


if __name__ == "__main__":
    main()
