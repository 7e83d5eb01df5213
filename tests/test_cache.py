"""The commands' persistent compilation cache: one that cannot be written is
one warning and the run goes on without it; one whose entries are damaged
is one line, not a warning per program.

The end-to-end cases run ``python -m experiments.run --rounds=1
--algorithm=fedavg`` (digits, embedded) in subprocesses, as a user would.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import warnings

import jax
import pytest

from experiments import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0
NOT_AS_ROOT = pytest.mark.skipif(
    ROOT_USER, reason="root writes a directory without write permission")

JAX_READ = ("Error reading persistent compilation cache entry for "
            "'jit_stage': error: Error -3 while decompressing data: "
            "incorrect header check")


def _run(tmp_path, *args, env=None):
  """``python -m experiments.run --rounds=1 --algorithm=fedavg`` with
  ``args``; the CompletedProcess."""
  env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"),
         "PYTHONUNBUFFERED": "1", **(env or {})}
  env = {k: v for k, v in env.items() if v is not None}
  return subprocess.run(
      [sys.executable, "-m", "experiments.run", "--rounds=1",
       "--algorithm=fedavg", *args], cwd=ROOT, env=env, capture_output=True,
      text=True, timeout=300)


def _cache_lines(stderr):
  return [line for line in stderr.splitlines() if "cache" in line.lower()]


def _read_only_dir(path):
  os.makedirs(path)
  os.chmod(path, stat.S_IRUSR | stat.S_IXUSR)
  return str(path)


# ----------------------------------------------------------------------------
# In the process.


def test_an_unwritable_cache_directory_says_why(tmp_path):
  a_file = tmp_path / "a_file"
  a_file.write_text("mine")
  assert cli.cache_unwritable(str(a_file)) == "it is a file, not a directory"
  assert cli.cache_unwritable(str(a_file / "cache")) == "not a directory"
  fine = tmp_path / "new" / "cache"
  assert cli.cache_unwritable(str(fine)) is None
  assert os.listdir(fine) == []  # the probe's file is gone
  assert a_file.read_text() == "mine"


@NOT_AS_ROOT
def test_a_directory_without_write_permission_is_unwritable(tmp_path):
  reason = cli.cache_unwritable(_read_only_dir(tmp_path / "ro"))
  assert reason == "permission denied"


def test_enabling_an_unwritable_cache_leaves_the_cache_as_it_was(tmp_path):
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  before = jax.config.jax_compilation_cache_dir
  with pytest.raises(OSError, match=f"^{a_file}: it is a file"):
    cli.enable_compilation_cache(str(a_file))
  assert jax.config.jax_compilation_cache_dir == before


def test_jax_cache_warnings_are_one_line_naming_the_directory(capsys):
  with warnings.catch_warnings(record=True) as passed:
    warnings.simplefilter("always")
    cli.quiet_cache_warnings("/the/cache")
    for program in ("jit_stage", "jit_iota", "jit_add"):
      warnings.warn(JAX_READ.replace("jit_stage", program))
    warnings.warn("Error writing persistent compilation cache entry for "
                  "'jit_add': PermissionError: denied")
    warnings.warn("something else")
  err = capsys.readouterr().err
  cache = _cache_lines(err)
  assert cache == [
      "warning: the compilation cache /the/cache holds entries that cannot "
      "be read (error: Error -3 while decompressing data: incorrect header "
      "check); their programs are compiled again, each run: delete the "
      "directory to rebuild it (further warnings about the cache are not "
      "shown)"], err
  assert [str(w.message) for w in passed] == ["something else"]  # as before


def test_a_write_failure_of_the_cache_is_its_own_line():
  line = cli.cache_warning_line(
      "/c", "Error writing persistent compilation cache entry for 'jit_add':"
      " OSError: [Errno 28] No space left on device")
  assert line == ("warning: the compilation cache /c cannot be written "
                  "(OSError: [Errno 28] No space left on device); programs "
                  "are compiled again, each run (further warnings about the "
                  "cache are not shown)")
  assert cli.cache_warning_line("/c", "an unrelated warning") is None


# ----------------------------------------------------------------------------
# The command.


def _a_file(tmp_path):
  path = tmp_path / "a_file"
  path.write_text("")
  return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("where,make,reason", [
    ("a file", _a_file, "it is a file, not a directory"),
    ("read-only", lambda t: _read_only_dir(t / "ro"), "permission denied"),
])
def test_an_unwritable_cache_dir_is_one_warning_and_the_run_goes_on(
    tmp_path, where, make, reason):
  if where == "read-only" and ROOT_USER:
    pytest.skip("root writes a directory without write permission")
  directory = make(tmp_path)
  result = _run(tmp_path, f"--output_dir={tmp_path / 'out'}",
                f"--compilation_cache_dir={directory}")
  assert result.returncode == 0, result.stderr
  assert "Traceback" not in result.stderr, result.stderr
  assert _cache_lines(result.stderr) == [
      f"warning: the compilation cache cannot be kept in {directory}: "
      f"{reason}; running without it (give --compilation_cache_dir a "
      "directory you can write, or --nocompilation_cache)"], result.stderr
  assert os.path.exists(tmp_path / "out" / "summary.json")


@pytest.mark.slow
@pytest.mark.parametrize("home", ["a file", "read-only"])
def test_a_home_that_cannot_be_written_is_one_warning(tmp_path, home):
  """The default cache, ``~/.cache/augfl_jax/jax_cache`` without
  ``XDG_CACHE_HOME``, under a HOME that cannot hold it."""
  if home == "read-only" and ROOT_USER:
    pytest.skip("root writes a directory without write permission")
  home_dir = (_a_file(tmp_path) if home == "a file"
              else _read_only_dir(tmp_path / "home"))
  result = _run(tmp_path, f"--output_dir={tmp_path / 'out'}",
                env={"HOME": home_dir, "XDG_CACHE_HOME": None})
  assert result.returncode == 0, result.stderr
  assert "Traceback" not in result.stderr, result.stderr
  lines = _cache_lines(result.stderr)
  directory = os.path.join(home_dir, ".cache", "augfl_jax", "jax_cache")
  assert len(lines) == 1 and lines[0].startswith(
      f"warning: the compilation cache cannot be kept in {directory}: "), (
          result.stderr)
  assert "running without it" in lines[0]


@pytest.mark.slow
def test_a_poisoned_cache_is_one_line(tmp_path):
  cache = tmp_path / "cache"
  first = _run(tmp_path, f"--output_dir={tmp_path / 'first'}",
               f"--compilation_cache_dir={cache}")
  assert first.returncode == 0, first.stderr
  entries = [os.path.join(d, f) for d, _, files in os.walk(cache)
             for f in files]
  assert len(entries) > 10
  for path in entries:
    with open(path, "wb") as f:
      f.write(b"garbage, not a compiled program" * 3)
  second = _run(tmp_path, f"--output_dir={tmp_path / 'second'}",
                f"--compilation_cache_dir={cache}")
  assert second.returncode == 0, second.stderr
  assert "Traceback" not in second.stderr, second.stderr
  assert "UserWarning" not in second.stderr, second.stderr
  lines = _cache_lines(second.stderr)
  assert len(lines) == 1 and lines[0].startswith(
      f"warning: the compilation cache {cache} holds entries that cannot "
      "be read ("), second.stderr
  assert "delete the directory to rebuild it" in lines[0]
