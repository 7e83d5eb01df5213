"""The documentation (docs/, BUILD.md "Documentation"): the API reference
covers every module of augfl_jax, and Sphinx builds it with warnings as
errors, every public name documented where it is defined. The code blocks
of docs/'s pages run in tests/test_readme.py, with README's."""

import configparser
import glob
import importlib
import os
import pkgutil
import re
import subprocess
import sys
import types

import pytest

import augfl_jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


def _modules():
  """Every module of augfl_jax, packages included: name -> is a package."""
  return {"augfl_jax": True, **{
      m.name: m.ispkg for m in pkgutil.walk_packages(augfl_jax.__path__,
                                                     "augfl_jax.")}}


def _directives(name):
  """The arguments of every ``.. name::`` (reST) or ``{name}`` (MyST)
  directive of the pages under docs/."""
  found = []
  for path in sorted(glob.glob(os.path.join(DOCS, "**", "*.*"),
                               recursive=True)):
    if path.endswith((".rst", ".md")) and "_build" not in path:
      found += re.findall(rf"(?:\.\. {name}::|```\{{{name}\}})\s+(\S+)",
                          open(path).read())
  return found


def test_every_module_is_in_the_reference_once():
  """A module of augfl_jax has one ``automodule`` in docs/api/ (a new module
  cannot be left out silently), a package a ``public-names`` table too, and
  each has an ``__all__``, which is what the reference documents."""
  modules = _modules()
  documented = _directives("automodule")
  assert sorted(set(modules) - set(documented)) == [], (
      "add an automodule for these modules to a page of docs/api/")
  assert sorted(set(documented) - set(modules)) == [], (
      "these automodule directives name no module of augfl_jax")
  assert sorted(m for m in set(documented) if documented.count(m) > 1) == []
  packages = {m for m, is_package in modules.items() if is_package}
  assert sorted(packages - set(_directives("public-names"))) == []
  assert [m for m in modules
          if not hasattr(importlib.import_module(m), "__all__")] == [], (
              "give these modules an __all__: the reference documents it")


def test_the_test_extra_builds_the_docs():
  """The ``docs`` extra is Sphinx and myst-parser, and the ``test`` extra
  (CI's) holds it: the suite builds the documentation."""
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(ROOT, "setup.cfg"))
  extras = {name: set(value.split())
            for name, value in cfg["options.extras_require"].items()}
  assert {r.split(">")[0] for r in extras["docs"]} == {"sphinx",
                                                       "myst-parser"}
  assert extras["docs"] <= extras["test"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """The HTML reference, built as BUILD.md says (``-W``: a warning fails);
  yields its directory."""
  out = tmp_path_factory.mktemp("docs_html")
  result = subprocess.run(
      [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
       "html", DOCS, str(out)],
      cwd=ROOT, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "WARNING" not in result.stderr and "ERROR" not in result.stderr
  yield out


def _anchors(page):
  return set(re.findall(r'id="(augfl_jax[\w.]*)"', page.read_text()))


@pytest.mark.slow
def test_docs_build_with_warnings_as_errors(built):
  """The pages hold the reference's anchors and the package tables link
  each public name to where it is documented."""
  api = built / "api"
  assert "augfl_jax.algorithms.augfl.admm.make_round" in _anchors(
      api / "algorithms.html")
  assert "augfl_jax.core.intervals.ratio_interval" in _anchors(
      api / "core.html")
  training = api / "training.html"
  assert "augfl_jax.training.loop.run" in _anchors(training)
  # training.run, in the package's table, links to loop.run.
  assert re.search(r'href="#augfl_jax\.training\.loop\.run"[^>]*>'
                   r'(?:<[^>]+>)*run(?:<[^>]+>)*</a>', training.read_text())
  assert 'id="module-augfl_jax.training"' in training.read_text()
  assert (built / "index.html").exists()


@pytest.mark.slow
def test_every_public_name_is_documented_as_itself(built):
  """Each name of each module's ``__all__`` (a module of augfl_jax is its
  own entry) has an entry in the reference under a module that holds the
  same object: adding a function to an ``__all__`` documents it."""
  anchors = set().union(*(_anchors(p) for p in (built / "api").glob("*.html")))
  missing = []
  for modname in _modules():
    module = importlib.import_module(modname)
    for name in module.__all__:
      value = getattr(module, name)
      if name.startswith("__") or isinstance(value, types.ModuleType):
        continue
      homes = [a.rpartition(".")[0] for a in anchors
               if a.rpartition(".")[2] == name]
      if not any(getattr(sys.modules.get(h), name, None) is value
                 for h in homes):
        missing.append(f"{modname}.{name}")
  assert missing == []
