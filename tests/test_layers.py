"""The layers above the engine (rlkit.agents, rlkit.buffers, rlkit.train and the top-level
modules) use only rlkit.core's public names: no ``_``-prefixed module or name imported from it,
no Tensor handle (``._impl``), no raw op string (``ops.apply``). (The kernel benchmarks in
scripts/ time native ops and their backward helpers by name, on purpose.)"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _modules_above_the_core() -> list[pathlib.Path]:
    return sorted(p for p in (ROOT / "rlkit").rglob("*.py") if (ROOT / "rlkit" / "core") not in p.parents)


def _private_reaches(source: str, name: str) -> list[str]:
    """Each use of a private name of rlkit.core in ``source`` (a module's text), as name:line."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlkit.core"):
            private = [p for p in node.module.split(".") if p.startswith("_")]
            private += [a.name for a in node.names if a.name.startswith("_")]
            if private:
                found.append(f"{where} imports {private} from {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"{where} imports {a.name}" for a in node.names
                      if a.name.startswith("rlkit.core") and any(p.startswith("_") for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr == "_impl":
            found.append(f"{where} reads a tensor's native handle (._impl)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "apply":
            owner = node.func.value
            if (isinstance(owner, ast.Name) and owner.id == "ops") or (isinstance(owner, ast.Attribute) and owner.attr == "ops"):
                found.append(f"{where} applies a native op by its name (ops.apply)")
    return found


def test_the_layers_above_the_core_use_only_its_public_names():
    modules = _modules_above_the_core()
    assert len(modules) > 25  # the scan found the package
    reaches = [reach for path in modules for reach in _private_reaches(path.read_text(), str(path.relative_to(ROOT)))]
    assert not reaches, "private names of rlkit.core used above it:\n" + "\n".join(reaches)


def test_the_scan_finds_each_kind_of_reach():
    """The check above can fail: a module with one reach of each kind gives one finding each."""
    source = ("from rlkit.core._checks import positive_int\nimport rlkit.core._runtime\n"
              "from rlkit.core.tensor import _NUMPY_DTYPES\nimport rlkit.core as rc\n"
              "rc.tensor([1.0])._impl\nrc.ops.apply('relu', ())\n")
    findings = _private_reaches(source, "probe.py")
    assert [f.split(" ", 1)[0] for f in findings] == [f"probe.py:{n}" for n in (1, 2, 3, 5, 6)], findings
