"""The docs site builds offline with warnings as errors, executing every notebook once; the
README's Python blocks run.

``test_docs_build_executes_every_notebook`` runs ``sphinx-build -W --keep-going`` on
``docs/`` with myst-nb forced to execute (``-D nb_execution_mode=force``): every notebook in
``notebooks/`` (through the ``docs/notebooks`` symlink) and every executable page runs
exactly once, in a fresh ``python3`` kernel. A cell that raises, in particular a failed
assertion cell, or any Sphinx/MyST warning fails the build and this test; the message names
the notebooks that the build log mentions. ``test_strict_build_fails_*`` show, on a tiny
throw-away site built with the same ``docs/conf.py``, that both kinds of failure are caught.

``test_readme_python_blocks_run_in_order`` executes every ```` ```python ```` block of
``README.md`` in order, in one namespace (a later block may use a name an earlier one
defined, as a reader running them in one session would).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NOTEBOOKS = ROOT / "notebooks"
README = ROOT / "README.md"
#: The README's first two commands: install and run the demo, then run the tests.
README_COMMANDS = (
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/python -m pymc_penalty.demo",
    'python3 -m venv .venv && .venv/bin/pip install ".[test]" && .venv/bin/python -m pytest',
)
#: Generous ceiling for the whole build; each notebook aims at under 90 s on 2 cores.
BUILD_TIMEOUT_S = 900


def sphinx_build(
    source: Path, out: Path, *extra: str, confdir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``sphinx-build -W --keep-going -b html`` in a subprocess; return its result."""
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q"]
    cmd += ["-d", str(out / ".doctrees")]
    if confdir is not None:
        cmd += ["-c", str(confdir)]
    cmd += [*extra, str(source), str(out / "html")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env, cwd=ROOT
    )


def failure_message(result: subprocess.CompletedProcess[str]) -> str:
    log = result.stdout + result.stderr
    named = sorted(set(re.findall(r"[\w./-]+\.(?:ipynb|md)", log)))
    tail = "\n".join(log.splitlines()[-80:])
    return f"sphinx-build exited {result.returncode}; files named in the log: {named}\n{tail}"


def _notebook(cells: list[str]) -> dict:
    return {
        "cells": [
            {"cell_type": "markdown", "id": "t", "metadata": {}, "source": "# A failing notebook"}
        ]
        + [
            {
                "cell_type": "code",
                "id": f"c{i}",
                "metadata": {},
                "execution_count": None,
                "outputs": [],
                "source": src,
            }
            for i, src in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _tiny_site(tmp_path: Path, index: str, notebook: dict | None = None) -> Path:
    src = tmp_path / "src"
    src.mkdir(parents=True)
    (src / "index.md").write_text(index)
    if notebook is not None:
        (src / "nb.ipynb").write_text(json.dumps(notebook))
    return src


@pytest.mark.slow
def test_strict_build_fails_on_a_warning(tmp_path):
    ok = _tiny_site(tmp_path / "ok", "# Fine\n\nSee [the algorithm](#fine).\n")
    result = sphinx_build(ok, tmp_path / "ok_out", confdir=DOCS)
    assert result.returncode == 0, failure_message(result)

    broken = _tiny_site(tmp_path / "bad", "# Broken\n\nSee [nowhere](missing-page.md).\n")
    result = sphinx_build(broken, tmp_path / "bad_out", confdir=DOCS)
    assert result.returncode != 0
    assert "missing-page" in result.stderr, failure_message(result)


@pytest.mark.slow
def test_strict_build_fails_on_a_failed_notebook_assertion(tmp_path):
    index = "# Site\n\n```{toctree}\nnb\n```\n"
    nb = _notebook(["x = 1 + 1", "assert x == 3, 'the check cell failed'"])
    src = _tiny_site(tmp_path, index, nb)
    result = sphinx_build(src, tmp_path / "out", "-D", "nb_execution_mode=force", confdir=DOCS)
    assert result.returncode != 0
    log = result.stdout + result.stderr
    # The log names the notebook and shows the failed assertion.
    assert "nb.ipynb" in log, failure_message(result)
    assert "the check cell failed" in log, failure_message(result)


def test_notebooks_are_stored_without_outputs_and_with_a_python3_kernel():
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert paths, "no notebooks found"
    assert (DOCS / "notebooks").resolve() == NOTEBOOKS.resolve()
    for path in paths:
        nb = json.loads(path.read_text())
        assert nb["metadata"]["kernelspec"]["name"] == "python3", path.name
        first = nb["cells"][0]
        assert first["cell_type"] == "markdown" and "".join(first["source"]).startswith("# ")
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert not cell["outputs"] and cell["execution_count"] is None, path.name


@pytest.mark.slow
def test_docs_build_executes_every_notebook(tmp_path):
    result = sphinx_build(DOCS, tmp_path, "-D", "nb_execution_mode=force")
    assert result.returncode == 0, failure_message(result)
    html = tmp_path / "html"
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        page = html / "notebooks" / f"{path.stem}.html"
        assert page.exists(), f"{path.name} is not in the site"
        # Executed: the page carries cell outputs, and no error output.
        text = page.read_text()
        assert "cell_output" in text, f"{path.name} was not executed"
        assert "Traceback" not in text, path.name
    for name in ("api", "algorithm", "threat-model", "choosing-parameters", "accounting"):
        assert (html / f"{name}.html").exists(), name
    # Every public name of the package has an entry in the API reference.
    import pymc_penalty

    documented = set(re.findall(r'id="(pymc_penalty\.[\w.]+)"', (html / "api.html").read_text()))
    public = [
        n
        for n in pymc_penalty.__all__
        if n != "__version__" and not inspect.ismodule(getattr(pymc_penalty, n))
    ]
    missing = [n for n in public if not any(d.split(".")[-1] == n for d in documented)]
    assert not missing, f"public names missing from docs/api.md: {missing}"


def readme_blocks() -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block of README.md, in order."""
    return re.findall(r"^```([\w-]*)\n(.*?)^```\s*$", README.read_text(), flags=re.M | re.S)


def test_readme_starts_with_the_install_and_test_commands():
    blocks = readme_blocks()
    assert [(lang, code.strip()) for lang, code in blocks[:2]] == [
        ("bash", cmd) for cmd in README_COMMANDS
    ]
    # Every Python block is marked ```python, so the test below runs all of them.
    assert not [lang for lang, _ in blocks if lang in ("py", "python3", "pycon", "ipython")]


@pytest.mark.slow
def test_readme_python_blocks_run_in_order(tmp_path, monkeypatch):
    blocks = [code for lang, code in readme_blocks() if lang == "python"]
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)  # anything a block writes stays out of the repository
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": "__readme__"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)


def _docs_command_output() -> str:
    """The output folder of the docs build command the README documents."""
    found = re.search(r"python -m sphinx -b html docs (\S+?)`", README.read_text())
    assert found, "README.md documents no docs build command"
    return found.group(1)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["documented", "control"])
def test_docs_build_writes_nothing_outside_its_build_folder(tmp_path, layout):
    """MyST-NB writes ``jupyter_execute`` and ``.jupyter_cache`` beside the output folder.
    Built as documented (``docs/_build/html``) they stay in ``docs/_build``; the control
    (output ``docs/_build`` itself) shows that they would land in the source folder."""
    assert _docs_command_output() == "docs/_build/html"
    ignored = (ROOT / ".gitignore").read_text().split()
    assert {"jupyter_execute/", ".jupyter_cache/", "/docs/_build/"} <= set(ignored)
    src = _tiny_site(tmp_path, "# T\n\n```{toctree}\nnb\n```\n", _notebook(["print(1)"]))
    before = set(os.listdir(src))
    out = src / "_build" / ("html" if layout == "documented" else "")
    cmd = [sys.executable, "-m", "sphinx", "-q", "-b", "html", "-c", str(DOCS)]
    cmd += ["-d", str(src / "_build" / ".doctrees"), str(src), str(out)]
    env = {**os.environ, "PYMC_PENALTY_NB_EXECUTION": "cache"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    added = set(os.listdir(src)) - before - {"_build"}
    if layout == "documented":
        assert added == set(), added
        assert (src / "_build" / "jupyter_execute").exists()
    else:
        assert {"jupyter_execute", ".jupyter_cache"} <= added
