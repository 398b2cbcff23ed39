"""The house (issue 14): every command in one ``fireledger.cli`` package, planes that import no surface,
no import cycles, one ``--db`` default, and the import-linter contracts of ``pyproject.toml`` kept.

The import graph here is read from the sources with :mod:`ast` (every import, also the ones inside
functions), so these checks run without import-linter; :func:`test_import_linter_contracts_are_kept`
runs the contracts themselves where import-linter is installed (``make test`` runs ``lint-imports``).
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PKG = SRC / "fireledger"

#: Packages allowed to hold an import cycle: none since the per-area store split (decision 0110).
KNOWN_CYCLE_PACKAGES: tuple[str, ...] = ()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """Every module ``name`` imports (fireledger modules resolved; others by top-level name) → first line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        out.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                add(sub if sub in known else mod, node.lineno)
    return out


def _graph() -> dict[str, dict[str, int]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def _internal(graph: dict[str, dict[str, int]]) -> dict[str, list[str]]:
    return {m: sorted(t for t in targets if t in graph and t != m) for m, targets in graph.items()}


def _cycles(adj: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(adj):
        if root in index:
            continue
        work = [(root, iter(adj[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(adj[nxt])))
                elif nxt in on_stack:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles() -> None:
    cycles = _cycles(_internal(_graph()))
    unexpected = [c for c in cycles
                  if not (KNOWN_CYCLE_PACKAGES and all(m.startswith(KNOWN_CYCLE_PACKAGES) for m in c))]
    assert unexpected == [], f"import cycles: {unexpected}"


def test_every_command_line_surface_is_in_the_cli_package() -> None:
    graph = _graph()
    outside = sorted(m for m, targets in graph.items()
                     if ("typer" in targets or any(t.startswith("typer.") for t in targets))
                     and not (m == "fireledger.cli" or m.startswith("fireledger.cli.")))
    assert outside == [], f"modules outside fireledger.cli that import typer: {outside}"
    assert (PKG / "cli" / "__init__.py").is_file()
    assert not (PKG / "cli.py").exists()


@pytest.mark.parametrize("plane", ["fireledger.timing", "fireledger.dispatch", "fireledger.security",
                                   "fireledger.retention", "fireledger.store", "fireledger.observe"])
def test_planes_import_no_surface(plane: str) -> None:
    graph = _graph()
    bad = sorted(f"{m} -> {t} (line {line})" for m, targets in graph.items()
                 if m == plane or m.startswith(plane + ".")
                 for t, line in targets.items()
                 if t.startswith(("fireledger.cli", "fireledger.control", "fireledger.service")))
    assert bad == [], f"{plane} imports a surface: {bad}"


def test_partition_of_lives_in_the_pure_core() -> None:
    from fireledger.domain.partition import DEFAULT_PARTITIONS, partition_of

    assert not (PKG / "control" / "partition.py").exists()
    assert 0 <= partition_of("tr_example") < DEFAULT_PARTITIONS
    assert partition_of("tr_example", 7) == partition_of("tr_example", 7)


def test_default_db_is_defined_once() -> None:
    where = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == "DEFAULT_DB" for t in targets):
                where.append(name)
    assert where == ["fireledger.cli.common"]


def test_the_console_script_entry_point_and_every_command_are_there() -> None:
    import typer

    from fireledger import cli

    assert callable(cli.main)
    group = typer.main.get_command(cli.app)
    ctx = group.make_context("fireledger", ["--help"], resilient_parsing=True)
    tree = {}
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        tree[name] = sorted(sub.list_commands(ctx)) if hasattr(sub, "list_commands") else None
    assert tree == {
        "preview": None, "serve": None, "timing": None, "dispatch": None, "control": None,
        "triggers": None, "fires": None, "why": None, "status": None, "backfill": None, "init": None,
        "tenant": ["create", "delete", "purge", "quota"], "db": ["upgrade"], "audit": ["export", "head", "verify"],
        "history": ["export", "purge"], "due-index": ["rebuild", "report"], "partitions": ["set", "show"],
        "report": ["smearing"], "keys": ["prune", "rotate", "show", "stage"], "restore": None, "backup": None,
        "apply": None,
    }
    assert 'fireledger = "fireledger.cli:main"' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_import_linter_contracts_are_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("importlinter", reason="import-linter (the dev extra) is not installed here")
    from importlinter.cli import lint_imports

    monkeypatch.syspath_prepend(str(SRC))
    monkeypatch.chdir(tmp_path)   # its cache goes here, not into the checkout
    # import-linter configures logging as a command does (it disables the loggers that exist, ours
    # included), which silenced every later test's log capture: keep the process's logging as it was.
    loggers = {n: (lg.disabled, lg.level, list(lg.handlers), lg.propagate)
               for n, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    root = (logging.root.level, list(logging.root.handlers))
    try:
        assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0
    finally:
        for n, (disabled, level, handlers, propagate) in loggers.items():
            lg = logging.getLogger(n)
            lg.disabled, lg.level, lg.handlers[:], lg.propagate = disabled, level, handlers, propagate
        logging.root.level, logging.root.handlers[:] = root[0], root[1]
