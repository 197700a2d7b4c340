"""Sphinx configuration of the kdist_magics documentation (``make docs``).

Offline: nothing is fetched at build time, no notebook is executed (the tutorials show the
outputs CI saved, see ``_ext/kdist_sources.py``), and TensorFlow, Keras and Horovod are not
imported (autodoc mocks them), so a build takes seconds.
"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

import kdist_magics  # noqa: E402
from sphinx.ext.autodoc.mock import MockFinder  # noqa: E402
import kdist_sources  # noqa: E402

kdist_sources.generate(ROOT, DOCS)

project = "kdist_magics"
author = "kdist_magics developers"
copyright = "kdist_magics developers"
release = version = kdist_magics.__version__

extensions = [
    "myst_nb",  # MyST Markdown pages and .ipynb notebooks
    "sphinx.ext.autodoc",
    "kdist_reference",  # the option and setting reference from the code
]

exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
smartquotes = False  # option help and error lines are shown as the code writes them (--, ')

# -- MyST and myst-nb ------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # never run a notebook here; show what CI executed
nb_merge_streams = True  # nbclient saves every stream message apart: one block per cell and stream
nb_ipywidgets_js = {}  # no widget JavaScript from a CDN: the dashboard shows its static view
nb_mime_priority_overrides = [
    ("html", "application/vnd.jupyter.widget-view+json", None),
    ("html", "application/vnd.jupyter.widget-state+json", None),
]

# -- API reference ---------------------------------------------------------------------------
autodoc_mock_imports = ["tensorflow", "keras", "horovod", "jax", "torch", "tf_keras"]
# for the whole build, not only while autodoc imports a module: the binding's lazy module
# __getattr__ would otherwise import Horovod (and TensorFlow) when autodoc lists its members
sys.meta_path.insert(0, MockFinder(autodoc_mock_imports))
autodoc_inherit_docstrings = False  # Keras' Callback docstrings are not ours
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": False}

# every internal reference must resolve (the build runs with -n -W); types from other projects
# are not linked (no intersphinx: the build is offline)
nitpicky = True
nitpick_ignore_regex = [
    ("py:class", r"(typing|collections\.abc|_stragglers|kdist_magics\.watch\.stragglers)\..*"),
    ("py:class", r"(Any|Callable|Straggler|optional|keras\..*|tensorflow\..*|horovod\..*)"),
    ("py:mod", r"kdist_magics\.watch\.stragglers"),  # named in RunRecord.stragglers, not documented here
    ("py:func", r"hosts_added"),  # kdist_magics.keras_horovod.elastic's docstring
]

# -- HTML ------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "kdist_magics"
html_static_path = []
html_theme_options = {
    "navigation_with_keys": False,
    "header_links_before_dropdown": 8,
    "show_toc_level": 2,
    "github_url": kdist_sources.REPO_URL,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_show_sourcelink = False
