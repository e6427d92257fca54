"""The package layout is its architecture: public names stay put, and no layer imports up.

Issue 30. Every import in the package, module-level or inside a function, is read from the
source with :mod:`ast`, so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import pymc_penalty as pp

PACKAGE = Path(pp.__file__).parent

#: Each top-level unit of the package and its layer: a module may import only its own unit
#: and units of a lower layer (the order in shared/STYLE.md).
LAYERS = {
    "errors": 0,
    "_version": 0,
    "validation": 1,
    "accounting": 2,
    "privacy": 3,
    "model": 4,
    "sampling": 5,
    "warmstart": 6,
    "planning": 7,
    "results": 8,
    "variants": 9,
    "contamination": 9,
    "backends": 9,
    "distributed": 10,
    "audit": 10,
    "api": 11,
    "budgeted": 11,
    "datasets": 0,
    "data": 0,
    "demo": 12,
    "__init__": 13,
}

#: Every public name of ``pymc_penalty`` at main e48aff3 (before the move), by attribute.
PUBLIC_NAMES = (
    "AuditResult BernoulliContamination BudgetExhausted EmpiricalPrivacy FrozenChainWarning "
    "InvalidArgumentError InvalidDataError ModelNotPrivateError NotPrivateWarning "
    "PenaltyMetropolis PrivacyAccountingError PrivacyBudget PrivacyCallback PrivacyLedger "
    "PrivateSamplingError ReportView RunPlan SamplingInterrupted StudentTContamination "
    "TruncatedStudentT UnpublishedResultWarning UtilityForecast UtilityWarning "
    "ConvergenceWarning convergence_verdict __version__ attach_report audit audit_releases "
    "audit_step audit_warm_start build_report calibrate contaminate contaminated_likelihood "
    "contamination diagnostics epsilon_curve estimate_privacy expected_acceptance finalize "
    "forecast_utility gdp_epsilon gdp_mu plot_epsilon plot_privacy privacy_curve "
    "recycled_mean recycled_summary recycled_terms report sample sample_contaminated"
).split()

#: Public modules a user imports by path.
PUBLIC_MODULES = (
    "pymc_penalty.accounting",
    "pymc_penalty.audit",
    "pymc_penalty.contamination",
    "pymc_penalty.variants",
    "pymc_penalty.distributed",
)


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":  # a package is named by its folder
            parts = parts[:-1]
        out.append((".".join(("pymc_penalty", *parts)), path))
    return out


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, module: str) -> set[str]:
    """Every ``pymc_penalty`` module imported anywhere in ``path`` (absolute names)."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pymc_penalty")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            if not name.startswith("pymc_penalty"):
                continue
            found.add(name)
            for alias in node.names:  # `from pymc_penalty.x import submodule`
                found.add(f"{name}.{alias.name}")
    return found


def _import_edges() -> list[tuple[str, str]]:
    known = {m for m, _ in _modules()}
    edges = []
    for module, path in _modules():
        for target in _imports(path, module):
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != module:
                edges.append((module, target))
    return edges


def test_every_unit_has_a_layer():
    assert {_unit(m) for m, _ in _modules()} <= set(LAYERS)


def test_no_module_imports_a_higher_layer():
    bad = [
        (a, b)
        for a, b in _import_edges()
        if _unit(a) != _unit(b) and LAYERS[_unit(b)] > LAYERS[_unit(a)]
    ]
    assert not bad, bad


def test_no_module_imports_the_package_root():
    # ``from pymc_penalty import x`` runs the root __init__, which imports every layer.
    bad = [(a, b) for a, b in _import_edges() if b == "pymc_penalty" and a != "pymc_penalty"]
    assert not bad, bad


def test_accounting_and_privacy_import_no_gate_sampler_or_results():
    higher = {"model", "sampling", "results", "warmstart", "planning", "audit", "api"}
    bad = [
        (a, b)
        for a, b in _import_edges()
        if _unit(a) in ("accounting", "privacy") and _unit(b) in higher
    ]
    assert not bad, bad


def test_no_import_cycle_between_modules():
    graph: dict[str, set[str]] = {}
    for a, b in _import_edges():
        if b != "pymc_penalty":
            graph.setdefault(a, set()).add(b)
    # A package __init__ re-exporting its submodules is not a cycle; drop package -> child.
    for a in graph:
        graph[a] = {b for b in graph[a] if not b.startswith(a + ".")}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, trail: list[str]) -> bool:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                cycle.extend(trail + [node, nxt])
                return True
            if nxt not in state and visit(nxt, trail + [node]):
                return True
        state[node] = 2
        return False

    for node in list(graph):
        if node not in state and visit(node, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_the_layering_check_catches_an_upward_import(tmp_path):
    # Must-fail control: an accounting module that imports the sampler is reported.
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    from pymc_penalty.sampling.step import PenaltyMetropolis\n")
    found = _imports(fake, "pymc_penalty.accounting.fake")
    assert "pymc_penalty.sampling.step" in found
    assert LAYERS[_unit("pymc_penalty.sampling.step")] > LAYERS["accounting"]


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_public_names_import_from_where_they_did(name):
    assert name in pp.__all__
    obj = getattr(pp, name)
    namespace: dict = {}
    exec(f"from pymc_penalty import {name} as imported", namespace)  # noqa: S102
    assert namespace["imported"] is obj


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_public_modules_import_by_path(module):
    importlib.import_module(module)


def test_every_public_exception_lives_in_errors():
    from pymc_penalty import errors

    for name in pp.__all__:
        obj = getattr(pp, name)
        if isinstance(obj, type) and issubclass(obj, BaseException | Warning):
            assert obj.__module__ == "pymc_penalty.errors", name
            assert getattr(errors, name) is obj
