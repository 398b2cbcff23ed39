"""Reading a ``fireledger apply`` file: YAML (or JSON) into :class:`~fireledger.control.declared.TriggersFile`,
every problem named by file, line and field path (decision 0185).

The YAML is composed node by node (safe tags only), so each value keeps its position: a problem
found by the model (the API's own validation) or later by the server (a dry run) is reported at the
line of the field it names, e.g. ``triggers.yaml:7:15: triggers.daily.schedule.zone: …``. A key
given twice in one mapping is refused (plain YAML would keep the last silently).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fireledger.control.declared import TriggersFile
from fireledger.errors import FireledgerError

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    """One problem of the file: the field's dotted path, its line and column (1-based), the text."""

    path: str
    line: int
    column: int
    text: str

    def render(self, filename: str) -> str:
        return f"{filename}:{self.line}:{self.column}: {self.path or '(file)'}: {self.text}"


class FileProblems(FireledgerError):
    """The file is refused: every problem found, each with its position. Nothing was changed."""

    def __init__(self, filename: str, problems: Sequence[Problem]) -> None:
        self.filename = filename
        self.problems = list(problems)
        super().__init__("\n".join(p.render(filename) for p in self.problems))


@dataclass
class Loaded:
    """A parsed, model-checked file and the position of every node (by path)."""

    filename: str
    model: TriggersFile
    positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def at(self, path: Path_, text: str) -> Problem:
        """A problem at ``path`` (the nearest enclosing node that has a position)."""
        return problem_at(self.positions, path, text)


def dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path)


def problem_at(positions: dict[Path_, tuple[int, int]], path: Path_, text: str) -> Problem:
    probe = tuple(path)
    while probe and probe not in positions:
        probe = probe[:-1]
    line, col = positions.get(probe, (1, 1))
    return Problem(dotted(path), line, col, text)


def _construct(node: yaml.Node, path: Path_, positions: dict[Path_, tuple[int, int]],
               problems: list[Problem]) -> Any:
    positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.SafeLoader.construct_scalar(_LOADER, key_node) if isinstance(key_node, yaml.ScalarNode) \
                else None
            if not isinstance(key, str):
                problems.append(Problem(dotted(path), key_node.start_mark.line + 1, key_node.start_mark.column + 1,
                                        "a key must be a plain string"))
                continue
            if key in out:
                problems.append(Problem(dotted((*path, key)), key_node.start_mark.line + 1,
                                        key_node.start_mark.column + 1, "is given twice in this mapping"))
                continue
            out[key] = _construct(value_node, (*path, key), positions, problems)
            if value_node.start_mark.line != key_node.start_mark.line:   # a block below its key: the key's line
                positions[(*path, key)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(n, (*path, i), positions, problems) for i, n in enumerate(node.value)]
    return _LOADER.construct_object(node, deep=True)


_LOADER = yaml.SafeLoader("")


def parse(text: str, filename: str) -> tuple[Any, dict[Path_, tuple[int, int]]]:
    """The document of ``text`` and each node's position; :class:`FileProblems` for bad YAML."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        raise FileProblems(filename, [Problem("", line, col, f"not valid YAML: {getattr(exc, 'problem', exc)}")]) \
            from None
    if node is None:
        return {}, {(): (1, 1)}
    positions: dict[Path_, tuple[int, int]] = {}
    problems: list[Problem] = []
    try:
        data = _construct(node, (), positions, problems)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        raise FileProblems(filename, [Problem("", line, col, f"not valid YAML: {getattr(exc, 'problem', exc)}")]) \
            from None
    if problems:
        raise FileProblems(filename, problems)
    return data, positions


def _model_path(loc: tuple[Any, ...]) -> Path_:
    """A pydantic error location as a file path (function-validator steps dropped)."""
    return tuple(p for p in loc if isinstance(p, int) or not (isinstance(p, str) and p.startswith("function-")))


def load_text(text: str, filename: str) -> Loaded:
    """Parse and check ``text`` with the API's own models; :class:`FileProblems` lists every problem."""
    data, positions = parse(text, filename)
    if not isinstance(data, dict):
        raise FileProblems(filename, [Problem("", 1, 1, "the file must be a mapping with `targets` and `triggers`")])
    try:
        model = TriggersFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False, include_input=False):
            path = _model_path(tuple(err["loc"]))
            problems.append(problem_at(positions, path, err["msg"]))
        raise FileProblems(filename, problems) from None
    return Loaded(filename, model, positions)


def load(path: Path) -> Loaded:
    """:func:`load_text` of the file at ``path`` (an unreadable file is a problem of the file)."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FileProblems(name, [Problem("", 1, 1, f"cannot be read: {exc.__class__.__name__}: "
                                                  f"{getattr(exc, 'strerror', None) or exc}")]) from None
    return load_text(text, name)


__all__ = ["FileProblems", "Loaded", "Problem", "dotted", "load", "load_text", "parse", "problem_at"]
