"""Sphinx configuration: augfl_jax's documentation and its API reference.

Build it from the repository's root (BUILD.md, "Documentation")::

  python -m sphinx -W --keep-going -b html docs docs/_build/html

The reference (``docs/api/``) is generated from the docstrings: a page per
package holds an ``automodule`` with ``:members:`` for each of its modules,
which documents the names of the module's ``__all__`` that the module itself
defines (a constant with the comment above or beside it). A name a module
imports and lists in its ``__all__`` (a package's re-exports) is documented
once, where it is defined; the ``public-names`` directive below lists a
package's ``__all__`` as a table whose rows link there. Adding a name to an
``__all__`` adds it to the reference; a new module needs its ``automodule``
line, which ``tests/test_docs.py`` checks.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import sys
import types

from docutils import nodes
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import inspect as sphinx_inspect
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the checkout's augfl_jax, installed or not

project = "augfl_jax"
author = "the augfl_jax authors"
copyright = "the augfl_jax authors"  # pylint: disable=redefined-builtin
release = importlib.import_module("augfl_jax").__version__

extensions = [
    "myst_parser",  # pages in Markdown
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the code's Google-style docstrings
]
# No intersphinx: the build reads nothing from the network.
exclude_patterns = ["_build"]
html_theme = "alabaster"  # built into Sphinx: nothing to download
html_title = f"augfl_jax {release}"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# The returned function's arguments, as the factories (make_*) state them.
napoleon_custom_sections = [("Args of the returned function", "params_style")]
myst_heading_anchors = 3

# A constant's value is shown when it is short; a registry's is not.
_MAX_VALUE_CHARS = 60


def modules() -> list[str]:
  """Every module of augfl_jax, packages included."""
  package = importlib.import_module("augfl_jax")
  return ["augfl_jax"] + [
      m.name for m in pkgutil.walk_packages(package.__path__, "augfl_jax.")]


@functools.cache
def _statements(modname: str) -> tuple[ast.stmt, ...]:
  """The top-level statements of module ``modname``'s source, with those
  under a top-level ``if`` or ``try``."""
  with open(importlib.util.find_spec(modname).origin) as f:
    pending = list(ast.parse(f.read()).body)
  found = []
  while pending:
    node = pending.pop(0)
    if isinstance(node, (ast.If, ast.Try)):
      pending[:0] = (node.body + node.orelse + getattr(node, "finalbody", []) +
                     [s for h in getattr(node, "handlers", []) for s in h.body])
    else:
      found.append(node)
  return tuple(found)


def _assigned(node: ast.stmt) -> list[str]:
  if isinstance(node, (ast.Assign, ast.AnnAssign)):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [n.id for t in targets for n in ast.walk(t)
            if isinstance(n, ast.Name)]
  return []


def defined(modname: str) -> frozenset[str]:
  """The names module ``modname``'s source defines (``def``, ``class``, an
  assignment), not those it imports."""
  names = set()
  for node in _statements(modname):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
      names.add(node.name)
    names.update(_assigned(node))
  return frozenset(names)


def home(modname: str, name: str) -> str | None:
  """The module that defines the ``name`` module ``modname`` holds, following
  its ``from M import name`` imports; None outside augfl_jax."""
  while modname.split(".")[0] == "augfl_jax":
    if name in defined(modname):
      return modname
    imports = {a.asname or a.name: node.module
               for node in _statements(modname)
               if isinstance(node, ast.ImportFrom) and not node.level
               for a in node.names}
    if name not in imports:
      return None
    modname = imports[name]
  return None


def _comment_docs(app) -> None:
  """``builder-inited``: a constant of an ``__all__`` without a ``#:`` doc
  comment is documented with the comment above (or beside) its assignment;
  autodoc leaves out module data that have none. (A function or class
  assigned to a name keeps its own docstring.)"""
  del app
  for modname in modules():
    module = importlib.import_module(modname)
    analyzer = ModuleAnalyzer.for_module(modname)
    analyzer.analyze()
    lines = analyzer.code.splitlines()
    for node in _statements(modname):
      for name in set(_assigned(node)) & set(getattr(module, "__all__", ())):
        value = getattr(module, name)
        if (("", name) in analyzer.attr_docs or isinstance(value, type)
            or sphinx_inspect.isroutine(value)):
          continue
        above = []
        row = node.lineno - 2
        while row >= 0 and lines[row].startswith("#"):
          above.insert(0, lines[row].lstrip("#").strip())
          row -= 1
        beside = lines[node.lineno - 1].partition("  # ")[2].strip()
        value = repr(value)
        # A meta field first (autodoc's, removed from the page), else
        # napoleon would read a comment's "a, b: c" as "type: text".
        hide = len(value) > _MAX_VALUE_CHARS or " at 0x" in value
        analyzer.attr_docs["", name] = [
            ":meta hide-value:" if hide else ":meta public:", "", *above,
            *([beside] if beside else []), ""]


def _skip(app, what, name, obj, skip, options):
  """``autodoc-skip-member``: a name of a module's ``__all__`` is documented
  in the module that defines it (a constant too, ``_comment_docs``); a
  class keeps autodoc's rules, less the functions of other libraries that
  it holds as attributes (a Flax module's initialisers)."""
  del skip, options
  current = getattr(app.env, "current_document", None)  # Sphinx >= 8.2
  modname = (current.autodoc_module if current is not None
             else app.env.temp_data.get("autodoc:module", ""))
  if not modname.startswith("augfl_jax"):
    return None
  if what == "class":
    foreign = inspect.isroutine(obj) and not getattr(
        obj, "__module__", "").startswith("augfl_jax")
    return True if foreign else None
  if what != "module" or name not in getattr(sys.modules[modname], "__all__",
                                             ()):
    return None  # autodoc's rules (which honour __all__)
  return name not in defined(modname)  # True: documented where defined


def _summary(modname: str, name: str | None) -> str:
  """The first paragraph of a module's (``name`` None) or of a member's
  docstring (a constant's: its doc comment)."""
  module = sys.modules[modname]
  if name is None:
    text = inspect.getdoc(module) or ""
  else:
    value = getattr(module, name)
    if inspect.isclass(value) or inspect.isroutine(value):
      text = inspect.getdoc(value) or ""
    else:
      analyzer = ModuleAnalyzer.for_module(modname)
      analyzer.analyze()
      text = "\n".join(l for l in analyzer.attr_docs.get(("", name), [])
                       if not l.startswith(":meta "))
  paragraph = text.strip().split("\n\n")[0]
  if re.fullmatch(r"\w[\w ]*:", paragraph.partition("\n")[0]):
    return ""  # a section (Attributes:, Args:) is no summary
  return paragraph.removesuffix("::")


class PublicNames(SphinxDirective):
  """``.. public-names:: package``: a table of the package's ``__all__``,
  each name linked to the module that defines and documents it, beside the
  first paragraph of its docstring (read in that module, as its relative
  references are)."""

  required_arguments = 1

  def run(self):
    package = importlib.import_module(self.arguments[0])
    rows = []
    for name in package.__all__:
      value = getattr(package, name)
      if name.startswith("__"):
        continue
      if isinstance(value, types.ModuleType):
        target, where, member = value.__name__, value.__name__, None
      else:
        where = home(package.__name__, name)
        if where is None:
          raise self.error(f"{package.__name__}.{name}: no module of "
                           "augfl_jax defines it")
        target, member = f"{where}.{name}", name
      rows.append((target, where, _summary(where, member).splitlines()))
    source = self.get_source_info()[0]
    content = StringList([".. list-table::", "   :widths: 1 3", ""],
                         source=source)
    for target, where, summary in rows:
      for line in (f"   * - :py:obj:`~{target}`",
                   f"     - .. currentmodule:: {where}", ""):
        content.append(line, source)
      for offset, line in enumerate(summary):
        content.append(f"       {line}", f"docstring of {target}", offset)
    module = self.env.ref_context.get("py:module")
    holder = nodes.container()
    try:
      nested_parse_with_titles(self.state, content, holder)
    finally:  # the page goes on in its own module
      self.env.ref_context.pop("py:module", None)
      if module is not None:
        self.env.ref_context["py:module"] = module
    return holder.children


def _repository_links(app, doctree) -> None:
  """``doctree-read``: a page's Markdown link to a file of the repository
  outside docs/ (``../results/fashion_mnist/README.md``, ``../BUILD.md``),
  which GitHub follows, becomes a link to a copy of that file in the HTML
  (a download, as MyST makes a link to an image), not a missing page. It
  runs before Sphinx collects the page's downloads."""
  source_dir = os.path.dirname(app.env.doc2path(app.env.docname))
  for node in list(doctree.findall(addnodes.pending_xref)):
    target = node.get("reftarget", "")
    if (node.get("reftype") != "myst" or node.get("refdomain") != "doc"
        or target in app.env.found_docs):
      continue
    for suffix in app.config.source_suffix:
      path = os.path.join(app.srcdir, target + suffix)
      if (os.path.isfile(path) and
          os.path.commonpath([path, app.srcdir]) != str(app.srcdir)):
        link = addnodes.download_reference(
            refdomain=None, reftarget=os.path.relpath(path, source_dir),
            refdoc=node.get("refdoc"), reftype="myst",
            refexplicit=node.get("refexplicit"))
        link.source, link.line = node.source, node.line
        link.extend(node.children)
        node.replace_self(link)
        break


def setup(app):
  app.connect("builder-inited", _comment_docs)
  app.connect("doctree-read", _repository_links, priority=400)
  app.connect("autodoc-skip-member", _skip)
  app.add_directive("public-names", PublicNames)
  return {"parallel_read_safe": True}
