r"""A run's round time and memory against its number of local processes.

  python -m benchmarks.processes --common="--dataset=digits --rounds=30 \
      --eval_every=10" --processes=1,2,4 --repeats=2 \
      --output=benchmarks/results/processes_digits.json

Runs ``experiments.run`` (``--common``) as 1, 2, 4, ... processes of
``--devices_per_process`` CPU devices each on this machine
(``augfl_jax.processes.local``), the same clients in every run: with N
processes each holds 1/N of them. The counts run in turn, ``--repeats``
times, so that load on the machine hits them alike. Per run: the seconds
per round between the first and the last evaluation (compilation excluded:
the first evaluation comes after the first round), from ``metrics.jsonl``;
every process's peak resident memory (``ru_maxrss`` of its ``wait4``); the
final accuracy (the same in every run, to float rounding); the load average.
Ratios are each count's time over one process's, within one repeat.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import tempfile
from typing import Any

from absl import flags

from augfl_jax.processes import local
from benchmarks import command

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("common", "--dataset=digits --rounds=30 "
                      "--eval_every=10", "flags of every run")
  flags.DEFINE_list("processes", ["1", "2", "4"], "process counts")
  flags.DEFINE_integer("devices_per_process", 1, "CPU devices per process",
                       lower_bound=1)
  flags.DEFINE_integer("repeats", 2, "runs per process count", lower_bound=1)
  flags.DEFINE_string("output", "processes.json", "JSON results path")
  command.check("common", shlex.split)
  command.integers("processes", 1)
  command.output()


def run_once(num_processes: int, devices: int, args: list[str],
             output_dir: str) -> dict[str, Any]:
  """One run of ``num_processes`` processes; its round time and memory
  (``output_dir`` is emptied first: :func:`command.check_started` reads
  it)."""
  shutil.rmtree(output_dir, ignore_errors=True)
  logs = [os.path.join(os.path.dirname(output_dir), f"p{i}.log")
          for i in range(num_processes)]
  procs = local.launch(
      num_processes, devices, [f"--output_dir={output_dir}", "--overwrite",
                               "--checkpoint_every=0", *args], logs=logs)
  codes, rss = [], []
  for proc in procs:
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    codes.append(proc.returncode)
    rss.append(usage.ru_maxrss / 1024)  # KiB -> MiB
  record = {"processes": num_processes, "exit_codes": codes,
            "load_average": os.getloadavg()[0],
            "peak_rss_mib_per_process": rss}
  if any(codes):
    with open(logs[0]) as f:
      error = f.read().strip().splitlines()[-1:]
    command.check_started(codes[0], output_dir, error, args)
    return {**record, "error": error}
  with open(os.path.join(output_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  first, last = records[0], records[-1]
  return {**record, "seconds_per_round": (
      (last["seconds"] - first["seconds"]) / (last["round"] -
                                               first["round"])),
          "rounds_timed": f"{first['round'] + 1}-{last['round']}",
          "accuracy": last["accuracy"]}


def main(argv):
  del argv
  args = shlex.split(FLAGS.common)
  counts = [int(n) for n in FLAGS.processes]
  runs = []
  with tempfile.TemporaryDirectory() as tmp:
    for repeat in range(FLAGS.repeats):
      for n in counts:
        os.makedirs(os.path.join(tmp, f"{n}"), exist_ok=True)
        record = run_once(n, FLAGS.devices_per_process, args,
                          os.path.join(tmp, f"{n}", "run"))
        record["repeat"] = repeat
        runs.append(record)
        print(json.dumps(record), flush=True)
  table = {}
  for n in counts:
    mine = [r for r in runs if r["processes"] == n and "error" not in r]
    ratios = []
    for r in mine:
      base = next((b for b in runs if b["processes"] == counts[0] and
                   b["repeat"] == r["repeat"] and "error" not in b), None)
      if base is not None:
        ratios.append(r["seconds_per_round"] / base["seconds_per_round"])
    table[n] = {
        "seconds_per_round": [r["seconds_per_round"] for r in mine],
        f"ratio_to_{counts[0]}": ratios,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "peak_rss_mib_per_process": [max(r["peak_rss_mib_per_process"])
                                     for r in mine]}
  result = {"common": FLAGS.common, "devices_per_process":
            FLAGS.devices_per_process, "cpu_count": os.cpu_count(),
            "runs": runs, "by_processes": table}
  command.write_json(FLAGS.output, result)
  for n, row in table.items():
    print(f"{n} process(es): {row['seconds_per_round']} s/round, ratio to "
          f"{counts[0]}: {row[f'ratio_to_{counts[0]}']}, peak RSS per "
          f"process {row['peak_rss_mib_per_process']} MiB")


if __name__ == "__main__":
  command.run(define_flags, main)
