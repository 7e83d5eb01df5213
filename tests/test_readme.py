"""The code blocks of README.md and of the Markdown pages under docs/: a
page's Python snippets run as written, in order, in one namespace (each
builds on the ones before it), in a scratch working directory; its
``python -m experiments.run`` commands take only flags the command has."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def docs_pages():
  """The Markdown pages under docs/ (whichever there are), relative to
  ROOT; a local build's output (docs/_build) is no page."""
  pages = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
  return sorted(p for p in (os.path.relpath(p, ROOT) for p in pages)
                if "_build" not in p.split(os.sep))


def read(page):
  return open(os.path.join(ROOT, page)).read()


def python_snippets(text):
  """The ```python blocks of a Markdown text, in order."""
  return re.findall(r"```python\n(.*?)```", text, re.S)


def run_snippets(page, namespace):
  """Runs ``page``'s Python snippets in order in ``namespace``."""
  for i, snippet in enumerate(python_snippets(read(page))):
    exec(compile(snippet, f"{page} snippet {i + 1}", "exec"), namespace)  # pylint: disable=exec-used


def run_commands(text):
  """The flags of each ``python -m experiments.run --flag ...`` of a text,
  one string per command (its lines continued with a backslash joined; not
  the transcripts of errors, ``$ ...``)."""
  lines = "\n".join(l for l in text.splitlines() if not l.startswith("$ "))
  return re.findall(r"python -m experiments\.run((?: --[\w.]+(?:=\S*)?)*)",
                    lines.replace("\\\n", " ").replace("`", " "))


def check_run_flags(args):
  """Raises unless ``python -m experiments.run`` takes the flags ``args``
  (a string) and their values."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from experiments import cli  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()
  cli.define_config_flags(flag_values=values)
  cli.define_distributed_flags(flag_values=values)
  # Raises on a flag the run lacks (--help is the parser's: tested in
  # test_flags).
  values(["run"] + [a for a in args.split() if a != "--help"])
  cli.config_from_flags(values)


@pytest.mark.slow
def test_readme_python_snippets_run(tmp_path, monkeypatch, capsys):
  # w/o PM, w/ PM, one client, training.run
  assert len(python_snippets(read("README.md"))) >= 4
  monkeypatch.chdir(tmp_path)  # runs/ of the snippets lands here
  namespace = {}
  run_snippets("README.md", namespace)
  printed = [float(line) for line in
             capsys.readouterr().out.strip().splitlines()]
  assert len(printed) == 3
  without_pm, with_pm, run_accuracy = printed
  assert 0.5 < without_pm <= 1.0 and 0.5 < with_pm <= 1.0
  assert 0.0 <= run_accuracy <= 1.0
  assert namespace["theta_next"].keys() == namespace["params"].keys()


def test_readme_run_commands_parse_and_the_cpu_command_comes_first():
  """Every ``python -m experiments.run --flag ...`` of the README (not the
  transcripts of errors, ``$ ...``) takes only flags the command has and
  values it accepts; "Real data" puts the command that fits a CPU
  (results/fashion_mnist/'s PM and rounds) before the paper's."""
  text = read("README.md")
  commands = run_commands(text)
  assert len(commands) >= 6
  for args in commands:
    check_run_flags(args)
  real_data = text[text.index("## Real data"):text.index("## The library")]
  first = re.search(r"python -m experiments\.run [^\n`]*", real_data)[0]
  assert first == ("python -m experiments.run --dataset=fashion_mnist "
                   "--pm.model=cnn --pm.epochs=10 --rounds=100")
  results = open(os.path.join(ROOT, "results", "fashion_mnist",
                              "README.md")).read()
  assert all(flag in results for flag in first.split()[4:])  # PM, rounds


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", [p for p in docs_pages() if python_snippets(read(p))])
def test_docs_python_snippets_run(page, tmp_path, monkeypatch):
  """A page of docs/ runs its Python snippets as README does."""
  monkeypatch.chdir(tmp_path)  # runs/ of the snippets lands here
  run_snippets(page, {})


@pytest.mark.parametrize("page", docs_pages())
def test_docs_run_commands_parse(page):
  """A page of docs/ gives ``experiments.run`` only flags it takes."""
  for args in run_commands(read(page)):
    check_run_flags(args)


def _slug(heading):
  """The anchor GitHub (and MyST, ``myst_heading_anchors``) gives a
  Markdown heading: lower case, punctuation but ``-`` and ``_`` dropped,
  spaces as ``-``."""
  heading = re.sub(r"[`*]", "", heading.strip().lower())
  return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def _without_code(text):
  text = re.sub(r"```.*?```", "", text, flags=re.S)
  return re.sub(r"`[^`\n]*`", "", text)


def test_relative_links_of_the_markdown_pages_resolve():
  """A relative link of README, BUILD.md, docs/, results/ or
  benchmarks/'s Markdown pages names a file of the checkout, and its
  ``#anchor`` a heading of that page: a section moved to another page
  leaves no link behind."""
  pages = ["README.md", "BUILD.md"] + docs_pages() + sorted(
      os.path.relpath(p, ROOT) for folder in ("results", "benchmarks")
      for p in glob.glob(os.path.join(ROOT, folder, "**", "*.md"),
                         recursive=True))
  broken = []
  for page in pages:
    for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(read(page))):
      if re.match(r"[a-z]+:", target):  # https:, mailto:
        continue
      path, _, anchor = target.partition("#")
      where = os.path.normpath(os.path.join(os.path.dirname(page), path)
                               if path else page)
      if not os.path.exists(os.path.join(ROOT, where)):
        broken.append(f"{page}: {target} (no such file)")
      elif anchor and where.endswith(".md") and anchor not in {
          _slug(h) for h in re.findall(
              r"^#+ (.*)$", re.sub(r"```.*?```", "", read(where),
                                   flags=re.S), re.M)}:
        broken.append(f"{page}: {target} (no such heading)")
  assert len(pages) > 10 and broken == []
