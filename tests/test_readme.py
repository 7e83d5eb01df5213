"""The README's Python snippets run as written, in order, in one namespace
(each builds on the ones before it), in a scratch working directory."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_readme_python_snippets_run(tmp_path, monkeypatch, capsys):
  text = open(os.path.join(ROOT, "README.md")).read()
  snippets = re.findall(r"```python\n(.*?)```", text, re.S)
  assert len(snippets) >= 4  # w/o PM, w/ PM, one client, training.run
  monkeypatch.chdir(tmp_path)  # runs/ of the snippets lands here
  namespace = {}
  for i, snippet in enumerate(snippets):
    exec(compile(snippet, f"README.md snippet {i + 1}", "exec"), namespace)  # pylint: disable=exec-used
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
  from absl import flags  # pylint: disable=g-import-not-at-top
  from experiments import cli as run_flags  # pylint: disable=g-import-not-at-top
  text = open(os.path.join(ROOT, "README.md")).read()
  lines = "\n".join(l for l in text.splitlines() if not l.startswith("$ "))
  commands = re.findall(r"python -m experiments\.run((?: --[\w.]+(?:=\S*)?)*)",
                        lines.replace("`", " "))
  assert len(commands) >= 6
  for args in commands:
    values = flags.FlagValues()
    run_flags.define_config_flags(flag_values=values)
    run_flags.define_distributed_flags(flag_values=values)
    # Raises on a flag the run lacks (--help is the parser's: tested in
    # test_flags).
    values(["run"] + [a for a in args.split() if a != "--help"])
    run_flags.config_from_flags(values)
  real_data = text[text.index("## Real data"):text.index("## The library")]
  first = re.search(r"python -m experiments\.run [^\n`]*", real_data)[0]
  assert first == ("python -m experiments.run --dataset=fashion_mnist "
                   "--pm.model=cnn --pm.epochs=10 --rounds=100")
  results = open(os.path.join(ROOT, "results", "fashion_mnist",
                              "README.md")).read()
  assert all(flag in results for flag in first.split()[4:])  # PM, rounds
