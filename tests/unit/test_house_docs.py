"""The house's map stays true (issue 14, "Enforced"): docs/architecture.md's "Layers" diagram lists
exactly the layers of the import-linter contract in ``pyproject.toml``, in the same order, and its
"The path of one fire" names only modules that exist under ``src/fireledger``."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "fireledger"
DOC = ROOT / "docs" / "architecture.md"


def _section(title: str) -> str:
    """The text of the ``## title`` section of docs/architecture.md (up to the next ``## ``)."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end != -1 else len(text)]


def _contract_layers() -> list[set[str]]:
    """The ``layers`` contract's layers, top first, each as its set of names below ``fireledger.``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    return [{m.strip().removeprefix("fireledger.") for m in layer.split("|")} for layer in contract["layers"]]


def _doc_layers() -> list[set[str]]:
    """The diagram's layers, top first: each unindented line of the section's first code block, its
    first column (up to two spaces) split on ``|``, ``/`` and ``.py`` dropped."""
    block = _section("Layers (dependencies point one way)").split("```")[1]
    rows = [line for line in block.splitlines()[1:] if line and not line.startswith(" ")]
    return [{m.strip().removesuffix("/").removesuffix(".py") for m in re.split(r"\s{2,}", row)[0].split("|")}
            for row in rows]


def test_the_layers_diagram_matches_the_import_contract() -> None:
    contract, doc = _contract_layers(), _doc_layers()
    assert "store" in {m for layer in contract for m in layer}   # both were read
    assert doc == contract, (
        "docs/architecture.md 'Layers' differs from pyproject's [tool.importlinter] layers:\n"
        f"doc:      {[' | '.join(sorted(x)) for x in doc]}\ncontract: {[' | '.join(sorted(x)) for x in contract]}")


def test_the_path_of_one_fire_names_modules_that_exist() -> None:
    named = re.findall(r"`([a-z_/]+(?:\.py|/))`", _section("The path of one fire"))
    assert len(named) >= 10 and "timing/loop.py" in named
    missing = sorted({m for m in named if not (PKG / m).exists()})
    assert not missing, f"'The path of one fire' names modules that do not exist under src/fireledger: {missing}"
