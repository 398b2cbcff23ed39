"""The house (issue 14, "Enforced"): no module under ``src/fireledger`` over 500 lines, no function or
method over 80 lines.

A function's size is ``end_lineno - lineno + 1`` of its ``def`` (decorators not counted), read with
:mod:`ast`; a nested ``def`` (or a class inside a function) counts in its parent, which is the one
measured. Methods are named ``Class.method``. Command-line registration is declarative (``COMMANDS``
tables in ``cli/``), which keeps long registration functions out of the tree; the limit applies to
it like to everything else.

Until the per-area store split and the dispatch work of session 4 land, today's offenders in
``store/`` and ``dispatch/`` are listed in :data:`ALLOWED`. The list may only shrink: an entry that
is no longer an offender fails :func:`test_the_allowlist_names_only_todays_offenders`, so it cannot
go stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "fireledger"

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

#: Offenders allowed for now (none: the store split and the dispatch work brought every module and
#: function under its limit). An entry must be an offender, so the list can only shrink.
#: Keys: a module as its path under src/fireledger, a function as ``path::qualified.name``.
ALLOWED: frozenset[str] = frozenset()


def _function_sizes(tree: ast.Module) -> dict[str, int]:
    """Every outermost function of ``tree`` (module level or in classes, at any class depth) → its
    size in lines, nested definitions included; keys are qualified names (``Class.method``)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                out[prefix + child.name] = child.end_lineno - child.lineno + 1
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:   # if/try blocks at module or class level
                visit(child, prefix)

    visit(tree, "")
    return out


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    """(module path → lines, ``path::function`` → lines) for every module under src/fireledger."""
    modules: dict[str, int] = {}
    functions: dict[str, int] = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        text = path.read_text(encoding="utf-8")
        modules[rel] = len(text.splitlines())
        for name, size in _function_sizes(ast.parse(text)).items():
            functions[f"{rel}::{name}"] = size
    return modules, functions


def _offenders() -> dict[str, str]:
    """Every module over :data:`MAX_MODULE_LINES` and function over :data:`MAX_FUNCTION_LINES` →
    a description naming its size."""
    modules, functions = _sizes()
    out = {k: f"module {k}: {n} lines (limit {MAX_MODULE_LINES})"
           for k, n in modules.items() if n > MAX_MODULE_LINES}
    out.update({k: f"function {k}: {n} lines (limit {MAX_FUNCTION_LINES})"
                for k, n in functions.items() if n > MAX_FUNCTION_LINES})
    return out


def test_the_measure_counts_nested_definitions_in_their_parent() -> None:
    src = (
        "def outer():\n"          # 1
        "    def inner():\n"      # 2
        "        return 1\n"      # 3
        "    class Local:\n"      # 4
        "        def m(self):\n"  # 5
        "            pass\n"      # 6
        "    return inner\n"      # 7
        "class A:\n"
        "    class B:\n"
        "        async def m(self):\n"
        "            pass\n"
        "    if True:\n"
        "        def n(self):\n"
        "            pass\n"
    )
    assert _function_sizes(ast.parse(src)) == {"outer": 7, "A.B.m": 2, "A.n": 2}


def test_no_module_or_function_is_over_its_limit() -> None:
    modules, functions = _sizes()
    assert "service.py" in modules and "service.py::run" in functions   # the tree was found and measured
    offenders = _offenders()
    new = sorted(desc for key, desc in offenders.items() if key not in ALLOWED)
    assert not new, "over the house's size limits (split them into named functions/modules):\n" + "\n".join(new)


def test_the_allowlist_names_only_todays_offenders() -> None:
    offenders = _offenders()
    stale = sorted(key for key in ALLOWED if key not in offenders)
    assert not stale, ("no longer over the limit (or gone): remove from ALLOWED in tests/unit/test_house_sizes.py:\n"
                       + "\n".join(stale))
