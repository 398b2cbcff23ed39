"""fireledger.domain.evolve.evolve (decision 0207) makes exactly what dataclasses.replace makes."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fireledger.domain.evolve import evolve
from fireledger.domain.model import (
    DispatchJob,
    Fire,
    FireKind,
    FireState,
    Lane,
    Policies,
    Target,
    TargetKind,
    VerificationState,
)


def _fire(**kw: object) -> Fire:
    base = dict(tenant_id="t", trigger_id="g", scheduled_us=1, seq=0, version=1, kind=FireKind.SCHEDULED,
                lane=Lane.ON_TIME, state=FireState.PENDING, cause=None, decided_us=1, decided_by="n",
                dispatched_us=None, finished_us=None, tzdata_version="2026f", attempts=0, next_attempt_us=1)
    return Fire(**{**base, **kw})  # type: ignore[arg-type]


@given(attempts=st.integers(0, 10**6), until=st.integers(-2**63, 2**63 - 1), dispatched=st.none() | st.integers())
def test_a_fire_evolves_as_replace_makes_it(attempts: int, until: int, dispatched: int | None) -> None:
    f = _fire(eps_us=7, specs="x", attempt_base=2)
    changes = dict(state=FireState.DISPATCHING, attempts=attempts, next_attempt_us=until, dispatched_us=dispatched)
    got = evolve(f, **changes)
    assert got == dataclasses.replace(f, **changes)   # type: ignore[arg-type]
    assert type(got) is Fire and got is not f and f.state == FireState.PENDING   # the original is unchanged
    assert evolve(f) == f and evolve(f) is not f


def test_jobs_and_targets_evolve_as_replace_makes_them() -> None:
    t = Target("tg", "t", TargetKind.HTTP, "https://example.test/h", "sealed", VerificationState.VERIFIED, "tok", 1)
    job = DispatchJob(_fire(), 1, t, b"sealed", Policies(), "node", 5)
    opened = evolve(job, payload=b"{}", target=evolve(t, secret="whsec_x"))
    assert opened == dataclasses.replace(job, payload=b"{}", target=dataclasses.replace(t, secret="whsec_x"))
    assert job.payload == b"sealed" and job.target.secret == "sealed"


def test_an_unknown_field_is_refused_like_replace() -> None:
    with pytest.raises(TypeError):
        evolve(_fire(), no_such_field=1)
    with pytest.raises(TypeError):
        dataclasses.replace(_fire(), no_such_field=1)   # type: ignore[call-arg]


def test_a_class_with_post_init_goes_through_replace() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int
        b: int = 0

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("a < 0")

    assert evolve(Checked(1), b=2) == Checked(1, 2)
    with pytest.raises(ValueError):
        evolve(Checked(1), a=-1)   # the validation ran: replace was used
