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
