"""Sphinx configuration of the pymc-penalty docs (offline; warnings are errors in CI).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``. Notebooks live in
the top-level ``notebooks/`` directory and reach the docs through the ``docs/notebooks``
symlink. They are executed by myst-nb; ``tests/test_docs.py`` forces a fresh execution
(``-D nb_execution_mode=force``) so that CI runs every notebook exactly once and fails on
any error or failed assertion in a cell. Local builds default to ``cache`` (re-run only
notebooks that changed); set ``PYMC_PENALTY_NB_EXECUTION=off`` for a quick build without
outputs.
"""

from __future__ import annotations

import os

from pymc_penalty import __version__

project = "pymc-penalty"
author = "the pymc-penalty developers"
copyright = "the pymc-penalty developers"  # noqa: A001 (Sphinx's name)
release = __version__
version = __version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "numpydoc",
]

# tutorials/: the notebooks' rendered Markdown copies for GitHub readers
# (scripts/render_notebooks.py); the site renders the notebooks themselves.
exclude_patterns = [
    "_build",
    "**/.ipynb_checkpoints",
    "**/.jupyter_cache",
    "Thumbs.db",
    "tutorials/**",
]
root_doc = "index"

# --- MyST and notebooks ----------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = os.environ.get("PYMC_PENALTY_NB_EXECUTION", "cache")
nb_execution_timeout = 300  # seconds per cell; each notebook aims at under 90 s in total
# A failed cell (an assertion cell, say) is a warning, so -W fails the build, and
# --keep-going still executes and reports every other notebook.
nb_execution_raise_on_error = False
nb_execution_show_tb = True  # the log shows the failing cell and its traceback
nb_merge_streams = True

# --- API reference -------------------------------------------------------------------------
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "none"  # the numpydoc sections state the types
numpydoc_show_class_members = False
numpydoc_validation_checks: set[str] = set()

# --- HTML ----------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"pymc-penalty {version}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path: list[str] = []
