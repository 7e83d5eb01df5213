r"""Whole runs of ``python -m experiments.run`` under several flag sets.

  python -m benchmarks.run_defaults \
      --common="--dataset=digits --model=cnn --augfl.lam=0 --augfl.alpha=0.03 \
                --augfl.rho=0.7 --rounds=30" \
      --variants="vmap_xla=--strategy=vmap --conv_impl=xla;auto=" \
      --repeats=2 --output=defaults_cnn.json

What a user waits for, per flag set (``--variants``: ``label=flags`` pairs
separated by ``;``, each added to ``--common``). Each variant first runs once
with ``--rounds=2`` (``--warmup``), which fills JAX's persistent compilation
cache with its programs; then the variants run in turn, one run each,
``--repeats`` times, so that load on a shared machine hits them alike. Per
run: the process's wall time and, from its ``summary.json`` and
``config.json``, the first round's seconds (compilation included), the mean
of the later rounds, the final test-client accuracy and the strategy and
conv_impl it ran with. Ratios are each variant's time over the last
variant's, within one repeat.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import flags

from benchmarks import command

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags; defined only when it runs (no clash with other
  absl flags in one process)."""
  flags.DEFINE_string("common", "", "flags of every run")
  flags.DEFINE_string("variants", "vmap_xla=--strategy=vmap --conv_impl=xla;"
                      "auto=", "label=flags pairs separated by ';'")
  flags.DEFINE_integer("repeats", 2, "timed runs per variant", lower_bound=1)
  flags.DEFINE_bool("warmup", True, "one untimed --rounds=2 run per variant "
                    "first (fills the compilation cache)")
  flags.DEFINE_string("output", "run_defaults.json", "JSON results path")
  command.check("common", shlex.split)
  command.check("variants", parse_variants)
  command.output()


def parse_variants(text: str) -> list[tuple[str, list[str]]]:
  """``"a=--x=1 --y=2;b="`` -> ``[("a", ["--x=1", "--y=2"]), ("b", [])]``."""
  variants = []
  for part in text.split(";"):
    label, sep, args = part.partition("=")
    if not sep or not label.strip() or label.strip().startswith("-"):
      raise ValueError(f"a variant is label=flags, got {part!r}")
    variants.append((label.strip(), shlex.split(args)))
  return variants


def run_once(args: list[str], output_dir: str) -> dict[str, Any]:
  """One ``experiments.run`` process; its wall time and what it wrote
  (``output_dir`` is emptied first: :func:`command.check_started` reads
  it)."""
  shutil.rmtree(output_dir, ignore_errors=True)
  run_command = [sys.executable, "-m", "experiments.run",
                 f"--output_dir={output_dir}", "--overwrite",
                 "--checkpoint_every=0", *args]
  start = time.perf_counter()
  proc = subprocess.run(run_command, capture_output=True, text=True,
                        check=False)
  record = {"wall_s": time.perf_counter() - start, "rc": proc.returncode,
            "load_average": os.getloadavg()[0]}
  if proc.returncode != 0:
    error = proc.stderr.strip().splitlines()[-1:]
    command.check_started(proc.returncode, output_dir, error, args)
    return {**record, "error": error}
  with open(os.path.join(output_dir, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(output_dir, "config.json")) as f:
    config = json.load(f)
  return {**record, "first_round_s": summary["first_round_seconds"],
          "per_round_s": summary["seconds_per_round"],
          "accuracy": summary["final_accuracy"],
          "strategy": config["strategy"], "conv_impl": config.get("conv_impl")}


def ratios(records: list[dict[str, Any]], key: str) -> dict[str, list[float]]:
  """``{label: [record[key] / last variant's record[key], per repeat]}``."""
  labels = list(dict.fromkeys(r["label"] for r in records))
  by = {(r["label"], r["repeat"]): r.get(key) for r in records}
  repeats = sorted({r["repeat"] for r in records})
  base = labels[-1]
  return {label: [round(by[(label, k)] / by[(base, k)], 2) for k in repeats
                  if by[(label, k)] and by[(base, k)]]
          for label in labels}


def main(argv: list[str]) -> None:
  del argv
  common = shlex.split(FLAGS.common)
  variants = parse_variants(FLAGS.variants)
  records = []
  with tempfile.TemporaryDirectory() as tmp:
    if FLAGS.warmup:
      for label, args in variants:
        run_once(common + args + ["--rounds=2"], os.path.join(tmp, label))
    for k in range(FLAGS.repeats):
      for label, args in variants:
        record = {"label": label, "repeat": k,
                  **run_once(common + args, os.path.join(tmp, label))}
        records.append(record)
        print(json.dumps(record), flush=True)
  out = {"common": FLAGS.common, "variants": FLAGS.variants,
         "records": records, "wall_ratio": ratios(records, "wall_s"),
         "per_round_ratio": ratios(records, "per_round_s")}
  print("wall time / last variant's:", out["wall_ratio"])
  print("per-round time / last variant's:", out["per_round_ratio"])
  if FLAGS.output:
    command.write_json(FLAGS.output, out)
    print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
  command.run(define_flags, main)
