"""The plan of ``fireledger apply``: what to change so the tenant matches the file (decision 0185).

Identity is the name: a file trigger is the tenant's trigger of that name; a file target is matched
to the tenant's target by what identifies it there (an http target by its url, an internal one by
its callable, a queue by the trigger of the file that already uses it). Each file trigger is first
sent to ``POST /v1/triggers/dry-run`` — create's own checks, which store nothing — and compared with
the current trigger field by field on the normalised forms the dry run returns (the payload by its
keyed digest: the API never returns a payload). So a second apply of an unchanged file plans
nothing, and every problem of the file, local or found by the server, is known before any write.

Actions, in the order they run: ``create``/``verify`` targets; ``create``, ``amend`` (the changed
fields), ``pause``, ``resume`` triggers; with ``--prune`` ``delete`` what the file no longer names
(triggers, then targets), else those are listed as ``unmanaged``. A trigger whose target is an http
target not yet verified ``wait``s: it is not written until the target proves ownership.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fireledger.client import ApiError, Client
from fireledger.control.declared import TriggersFile
from fireledger.control.dryrun import DryRunDefinition
from fireledger.control.schemas import RetryPolicy, TriggerCreate, TriggerView
from fireledger.dispatch.internal import PREFIX as INTERNAL_PREFIX

from .declfile import FileProblems, Loaded, Problem

#: The trigger fields apply compares (besides the payload's digest and the state): every create field
#: the dry run's definition and the trigger view both show (tests/unit/test_apply_file.py requires all).
COMPARED = tuple(f for f in DryRunDefinition.model_fields
                 if f in TriggerView.model_fields and f in TriggerCreate.model_fields and f != "name")
_DECL_ONLY = {"target", "target_id", "paused"}
PAYLOAD = "payload"


@dataclass
class Action:
    """One change: ``verb`` on a ``kind`` (target or trigger) called ``name`` (the file's name);
    ``changes`` maps a field to (current, wanted) — a payload only as a size, never its value."""

    verb: str
    kind: str
    name: str
    id: str | None = None
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    note: str | None = None
    body: dict[str, Any] | None = field(default=None, repr=False)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.verb, "kind": self.kind, "name": self.name, "id": self.id}
        if self.changes:
            out["changes"] = {f: {"from": a, "to": b} for f, (a, b) in self.changes.items()}
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class TargetState:
    """A file target resolved against the tenant: its id (None: to be created) and whether a trigger
    may use it now."""

    name: str
    kind: str
    id: str | None
    usable: bool


@dataclass
class Plan:
    actions: list[Action]
    unmanaged: list[Action]
    targets: dict[str, TargetState]

    @property
    def empty(self) -> bool:
        return not any(a.verb != "wait" for a in self.actions)


def _identity(kind: str, url: str | None, name: str | None) -> str | None:
    if kind == "http":
        return f"http {url}"
    if kind == "internal":
        return f"internal {INTERNAL_PREFIX}{name}"
    return None


def _unproved(target: Any) -> bool:
    """An http target whose ownership is not proved (renewal before expiry is the server's job)."""
    return bool(target.kind == "http" and target.verification.state != "verified")


def local_problems(loaded: Loaded) -> list[Problem]:
    """What the file gets wrong on its own: a trigger's ``target`` not among the file's targets;
    two file targets with one identity (the same url or callable)."""
    f = loaded.model
    out = []
    for name, decl in f.triggers.items():
        if decl.target is not None and decl.target not in f.targets:
            out.append(loaded.at(("triggers", name, "target"), f"names no target of this file ({decl.target!r})"))
    seen: dict[str, str] = {}
    for name, t in f.targets.items():
        ident = _identity(t.kind, t.url, t.name)
        if ident is not None and ident in seen:
            out.append(loaded.at(("targets", name), f"is the same target as {seen[ident]!r} ({ident})"))
        elif ident is not None:
            seen[ident] = name
    return out


def _match_targets(f: TriggersFile, targets: list[Any], triggers: dict[str, Any],
                   known: dict[str, str]) -> dict[str, Any]:
    """File target name → the tenant's target it is (absent: none yet); ``known`` maps names to the
    ids of targets this apply has just created."""
    by_ident: dict[str, list[Any]] = {}
    for t in targets:
        ident = _identity(t.kind, t.url, (t.url or "").removeprefix(INTERNAL_PREFIX)) if t.kind == "internal" \
            else _identity(t.kind, t.url, None)
        if ident is not None:
            by_ident.setdefault(ident, []).append(t)
    by_id = {t.id: t for t in targets}
    out: dict[str, Any] = {}
    taken: set[str] = set()
    for name, spec in f.targets.items():
        ident = _identity(spec.kind, spec.url, spec.name)
        if name in known and known[name] in by_id:
            found = [by_id[known[name]]]
        elif ident is not None:
            found = sorted(by_ident.get(ident, []), key=lambda t: (t.verification.state != "verified", t.id))
            found = [t for t in found if t.id not in taken]
        else:   # a queue: the one the file's triggers of that target already use
            found = [by_id[tr.target_id] for n, d in f.triggers.items() if d.target == name and (tr := triggers.get(n))
                     and tr.target_id in by_id and by_id[tr.target_id].kind == spec.kind
                     and tr.target_id not in taken]
        if found:
            out[name] = found[0]
            taken.add(found[0].id)
    # Targets without an identity (queues) no trigger of the file tells apart are interchangeable:
    # each takes a remaining one of its kind that no trigger of the file uses, oldest id first.
    used = {tr.target_id for n, tr in triggers.items() if n in f.triggers}
    for name, spec in f.targets.items():
        if name not in out and _identity(spec.kind, spec.url, spec.name) is None:
            spare = [t for t in targets if t.kind == spec.kind and t.id not in taken and t.id not in used]
            if spare:
                out[name] = spare[0]
                taken.add(spare[0].id)
    return out


def _target_actions(f: TriggersFile, matched: dict[str, Any]) -> tuple[list[Action], dict[str, TargetState]]:
    actions, states = [], {}
    for name, spec in f.targets.items():
        t = matched.get(name)
        if t is None:
            body = spec.model_dump(exclude_unset=True)
            actions.append(Action("create", "target", name, changes={k: (None, v) for k, v in body.items()},
                                  note="then serve verification.response at challenge_path and apply again"
                                  if spec.kind == "http" else None, body=body))
            states[name] = TargetState(name, spec.kind, None, spec.kind != "http")
        elif _unproved(t):
            actions.append(Action("verify", "target", name, t.id, {"verification": (t.verification.state, "verified")},
                                  note=f"serve {t.verification.response!r} at {t.verification.challenge_path}"))
            states[name] = TargetState(name, t.kind, t.id, False)
        else:
            states[name] = TargetState(name, t.kind, t.id, True)
    return actions, states


def _field_path(name: str, field_name: str, decl: Any) -> tuple[str | int, ...]:
    parts: tuple[str | int, ...] = tuple(p for p in field_name.split(".") if p)
    if parts[:1] == ("target_id",):
        return ("triggers", name, "target" if decl.target is not None else "target_id")
    if parts[:1] == ("name",):
        return ("triggers", name)
    return ("triggers", name, *parts)


def _norm_schedule(schedule: dict[str, Any], declared: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schedule.items() if not (k == "anchor" and "anchor" not in declared)}


def _compare(current: Any, wanted: Any, decl: Any, digest: str | None) -> dict[str, tuple[Any, Any]]:
    """Changed fields of ``current`` (a TriggerView) against the dry run's normalised definition."""
    changes: dict[str, tuple[Any, Any]] = {}
    for f in COMPARED:
        a, b = getattr(current, f), getattr(wanted, f)
        if f == "schedule":
            a, b = _norm_schedule(a, decl.schedule), _norm_schedule(b, decl.schedule)
        a, b = (x.model_dump() if hasattr(x, "model_dump") else x for x in (a, b))
        if a != b:
            changes[f] = (a, b)
    if digest != current.payload_digest:
        changes[PAYLOAD] = ("(stored payload)", f"({wanted.payload_bytes} bytes)")
    return changes


def _amend_body(decl: Any, changes: dict[str, Any], target_id: str) -> dict[str, Any]:
    full = decl.model_dump(exclude=_DECL_ONLY)
    body: dict[str, Any] = {}
    for f in changes:
        if f == "target_id":
            body[f] = target_id
        elif f == "retry":
            body[f] = full["retry"] if full["retry"] is not None else RetryPolicy.model_validate({}).model_dump()
        else:
            body[f] = full[f]
    return body


def _dry_run(client: Client, loaded: Loaded, name: str, body: dict[str, Any], pending: bool,
             problems: list[Problem]) -> Any:
    """The dry run of a create body: its normalised definition and payload digest, or None when it
    is refused (the problems appended at their lines; a refusal of ``target_id`` alone is expected
    while the target is ``pending``)."""
    decl = loaded.model.triggers[name]
    try:
        return client.dry_run_create(body=body, count=1)
    except ApiError as exc:
        if exc.status != 422:
            raise
        errors = exc.errors or [{"field": "", "problem": exc.detail}]
        for e in errors:
            if pending and e.get("field") == "target_id":
                continue
            problems.append(loaded.at(_field_path(name, str(e.get("field") or ""), decl), str(e.get("problem"))))
        return None


def _trigger_actions(client: Client, loaded: Loaded, current: dict[str, Any], states: dict[str, TargetState],
                     problems: list[Problem]) -> list[Action]:
    actions: list[Action] = []
    for name, decl in loaded.model.triggers.items():
        state = states.get(decl.target) if decl.target is not None else TargetState("", "", decl.target_id, True)
        if state is None:
            continue   # a local problem already names it
        have = current.get(name)
        body = {"name": name, "target_id": state.id or (have.target_id if have else "tg_pending"),
                **decl.model_dump(exclude=_DECL_ONLY, exclude_unset=True)}
        dry = _dry_run(client, loaded, name, body, state.id is None or not state.usable, problems)
        if not state.usable:
            why = f"target {state.name!r} " + ("is to be created" if state.id is None else "is not verified")
            actions.append(Action("wait", "trigger", name, have.id if have else None, note=why + ", then proves "
                                  "ownership (serve verification.response at challenge_path; apply again)"))
            continue
        if have is not None and state.id is None:   # compared once the new target exists
            actions.append(Action("amend", "trigger", name, have.id, {"target_id": (have.target_id, "(new)")},
                                  note=f"after target {state.name!r} is created"))
            continue
        if have is None and (dry is not None or state.id is None):
            changes = {k: (None, "(set)" if k == PAYLOAD else v) for k, v in body.items() if k != "name"}
            if state.id is None:
                changes["target_id"] = (None, "(new)")
            actions.append(Action("create", "trigger", name, changes=changes, body=body))
            if decl.paused:
                actions.append(Action("pause", "trigger", name, changes={"state": ("active", "paused")}))
            continue
        if dry is None or have is None:
            continue
        want = dry.definition
        changes = _compare(have, want, decl, want.payload_digest)
        if changes:
            actions.append(Action("amend", "trigger", name, have.id, changes,
                                  body=_amend_body(decl, changes, want.target_id)))
        wanted_state = "paused" if decl.paused else "active"
        if have.state != wanted_state:
            actions.append(Action("pause" if decl.paused else "resume", "trigger", name, have.id,
                                  {"state": (have.state, wanted_state)}))
    return actions


def _unmanaged(loaded: Loaded, triggers: list[Any], targets: list[Any], matched: dict[str, Any],
               prune: bool, held: set[str]) -> list[Action]:
    """What the file does not name; ``held``: targets a file trigger that is not amended yet still uses."""
    named = set(loaded.model.triggers)
    keep = {t.id for t in matched.values()} | {d.target_id for d in loaded.model.triggers.values() if d.target_id}
    keep |= held
    verb = "delete" if prune else "unmanaged"
    out = [Action(verb, "trigger", t.name, t.id) for t in triggers if t.name not in named]
    out += [Action(verb, "target", t.url or t.kind, t.id) for t in targets if t.id not in keep]
    return out


def plan(client: Client, loaded: Loaded, *, prune: bool = False, known: dict[str, str] | None = None) -> Plan:
    """The plan for ``loaded`` against the tenant behind ``client`` (reads and dry runs only);
    ``known``: file target name → id of a target created by this apply. Raises
    :class:`FileProblems` with every problem of the file, local or found by the server."""
    problems = local_problems(loaded)
    if problems:
        raise FileProblems(loaded.filename, problems)
    targets = list(client.items(client.list_targets, limit=1000))
    listed = list(client.items(client.list_triggers, limit=1000))
    by_name: dict[str, list[Any]] = {}
    for t in listed:
        by_name.setdefault(t.name, []).append(t)
    for name in loaded.model.triggers:
        if len(by_name.get(name, [])) > 1:
            problems.append(loaded.at(("triggers", name), f"the tenant has {len(by_name[name])} triggers of this "
                                      "name (apply identifies triggers by name): delete or rename all but one"))
    current = {n: ts[0] for n, ts in by_name.items()}
    matched = _match_targets(loaded.model, targets, current, known or {})
    target_actions, states = _target_actions(loaded.model, matched)
    actions = target_actions + _trigger_actions(client, loaded, current, states, problems)
    if problems:
        raise FileProblems(loaded.filename, problems)
    deferred = {a.name for a in actions if a.kind == "trigger" and (a.verb == "wait" or a.note)}
    held = {current[n].target_id for n in deferred if n in current}
    unmanaged = _unmanaged(loaded, listed, targets, matched, prune, held)
    if prune:
        return Plan(actions + unmanaged, [], states)
    return Plan(actions, unmanaged, states)


__all__ = ["COMPARED", "Action", "Plan", "TargetState", "local_problems", "plan"]
