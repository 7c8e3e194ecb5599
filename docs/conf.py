"""Sphinx configuration for the multihead documentation (``make docs``: built offline into docs/_build/html).

MyST reads the Markdown guides (the same dialect as the README, so a guide and the README share snippets); autodoc
and napoleon read the API reference from the docstrings (Google-style ``Args:``/``Returns:`` sections).
"""

import multihead

project = "multihead"
author = "the multihead authors"
release = version = multihead.__version__
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
html_theme = "furo"
html_static_path = ["_static"]
html_css_files = ["multihead.css"]  # long command lines wrap instead of scrolling sideways
html_title = f"multihead {release}"
suppress_warnings = ["myst.header"]
