"""Sphinx configuration of graphkit's documentation.

Build it with ``python -m sphinx -W -b html docs docs/_build/html`` (warnings are errors). The notebooks in
``../notebooks`` are copied into ``docs/notebooks/`` and executed by myst-nb (results cached in
``docs/_build/.jupyter_cache``, so a rebuild runs only notebooks that changed); the pictures of the
concepts page are drawn by graphkit itself into ``docs/_generated/``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import graphkit  # noqa: E402

project = "graphkit"
author = "the graphkit authors"
copyright = "the graphkit authors"  # noqa: A001
release = graphkit.__version__
version = release

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.graphviz",
    "graphkit_docs",
]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints", "README.md"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# --- notebooks -------------------------------------------------------------------------------------------
nb_execution_mode = "cache"
nb_execution_timeout = 180
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# --- API reference ---------------------------------------------------------------------------------------
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True

# --- pictures --------------------------------------------------------------------------------------------
graphviz_output_format = "svg"

# --- HTML ------------------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "graphkit"
html_static_path = ["_static"]
html_css_files = ["graphkit.css"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_sidebars = {"**": ["sidebar-nav-bs"]}
html_last_updated_fmt = None


def copy_notebooks() -> None:
    """Copy ``../notebooks/*.ipynb`` into ``docs/notebooks/`` (only those that changed)."""
    target = DOCS / "notebooks"
    target.mkdir(exist_ok=True)
    wanted = {path.name: path for path in sorted((ROOT / "notebooks").glob("*.ipynb"))}
    for stale in target.glob("*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()
    for name, source in wanted.items():
        copy = target / name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            shutil.copyfile(source, copy)


copy_notebooks()
