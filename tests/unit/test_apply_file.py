"""Reading a ``fireledger apply`` file (decision 0185): every problem at its file, line, column and
field path (YAML syntax, a key given twice, the API models' own refusals), and the published JSON
Schema generated from the API's request models (a trigger declaration is ``TriggerCreate`` without
``name``/``target_id``, plus ``target``/``target_id``/``paused``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fireledger.cli.declfile import FileProblems, load, load_text
from fireledger.control.declared import TriggerDecl, TriggersFile, triggers_schema
from fireledger.control.schemas import TargetCreate, TriggerCreate

GOOD = """\
targets:
  q: {kind: queue}
triggers:
  daily:
    schedule: {cron: "0 9 * * 1-5", zone: Europe/Paris}
    target: q
    payload: {a: [1, 2]}
    retry: {max_attempts: 3}
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(FileProblems) as refused:
        load_text(text, "f.yaml")
    return str(refused.value).splitlines()


def test_a_good_file_is_the_api_models() -> None:
    loaded = load_text(GOOD, "f.yaml")
    decl = loaded.model.triggers["daily"]
    assert isinstance(loaded.model.targets["q"], TargetCreate)
    assert decl.model_dump(exclude_unset=True) == {"target": "q", "payload": {"a": [1, 2]},
                                                   "schedule": {"cron": "0 9 * * 1-5", "zone": "Europe/Paris"},
                                                   "retry": {"max_attempts": 3}}
    assert loaded.positions[("triggers", "daily", "retry", "max_attempts")] == (8, 27)
    assert load_text("", "empty.yaml").model == TriggersFile()


def test_every_problem_is_at_its_line_and_field() -> None:
    bad = GOOD.replace("{kind: queue}", "{kind: queue, colour: red}").replace("max_attempts: 3", "max_attempts: 300")
    bad += "    jitter: 5 minutes\n  daily:\n    schedule: {every: 1m}\n    target: q\n"
    assert _problems(bad) == ["f.yaml:10:3: triggers.daily: is given twice in this mapping"]
    bad = bad.split("  daily:\n    schedule: {every: 1m}")[0] + "  lonely:\n    schedule: {every: 1m}\n"
    assert _problems(bad) == [
        "f.yaml:2:28: targets.q.colour: Extra inputs are not permitted",
        "f.yaml:9:13: triggers.daily.jitter: String should match pattern '^([0-9]+(ms|s|m|h|d))+$'",
        "f.yaml:8:27: triggers.daily.retry.max_attempts: Input should be less than or equal to 185",
        "f.yaml:10:3: triggers.lonely: Value error, give exactly one of `target` (a name under targets) and "
        "`target_id`",
    ]


def test_bad_yaml_and_bad_shapes_name_the_line() -> None:
    assert _problems("targets: [\n") == ["f.yaml:2:1: (file): not valid YAML: expected the node content, but found "
                                         "'<stream end>'"]
    assert _problems("- a\n- b\n") == ["f.yaml:1:1: (file): the file must be a mapping with `targets` and `triggers`"]
    assert _problems("? [a]\n: 1\n") == ["f.yaml:1:3: (file): a key must be a plain string"]
    assert _problems("version: 2\n")[0].startswith("f.yaml:1:10: version: Input should be 1")


def test_an_unreadable_file_is_a_problem_of_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileProblems) as refused:
        load(tmp_path / "absent.yaml")
    assert str(refused.value).startswith(f"{tmp_path / 'absent.yaml'}:1:1: (file): cannot be read: FileNotFoundError")


def test_the_schema_is_generated_from_the_api_models() -> None:
    doc = triggers_schema()
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    decl = doc["$defs"]["TriggerDecl"]
    create = TriggerCreate.model_json_schema()
    assert set(decl["properties"]) == (set(create["properties"]) - {"name", "target_id"}) | {
        "target", "target_id", "paused"}
    for field in ("schedule", "catchup_horizon", "jitter", "missed_fire_policy"):
        assert decl["properties"][field] == create["properties"][field], field
    assert doc["$defs"]["TargetCreate"] == TargetCreate.model_json_schema()
    assert decl["additionalProperties"] is False and set(TriggerDecl.model_fields) >= {"schedule", "retry"}


def test_apply_compares_every_field_a_trigger_is_created_with() -> None:
    from fireledger.cli.declplan import COMPARED

    assert set(COMPARED) == set(TriggerCreate.model_fields) - {"name", "payload"}, (
        "a TriggerCreate field apply cannot compare: show it in DryRunDefinition and TriggerView too")
