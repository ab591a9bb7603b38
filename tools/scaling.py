"""The scaling report: one training config on 1, 2, 4, … N local devices, measured alike.

  ./launch.sh configs/cifar_vgg.py --config.scaling_report=True [--config.scaling_steps=60]

Each device count runs as its own process (on GPUs with CUDA_VISIBLE_DEVICES, on CPU with
that many XLA host devices), the way the original write-ups ran 1, 2, 4 and 8 GPUs, for
`scaling_steps` steps without checkpoints. Weak scaling keeps the per-device batch of the
config (global batch grows with the devices); strong scaling (`scaling_strong=True`) keeps
the global batch; on all N devices the two are the same run, measured once. Throughput is
the median over the log intervals after the first, which holds the warm-up. Beside the speed,
each run's last logged loss and final eval accuracy: the strong-scaling rows are one run (the
same global batch, the same batches and random draws) at different speeds, so these agree, to
the float rounding that training amplifies (docs/long_runs.md); weak-scaling rows train other
global batches. Writes WORKDIR/scaling.csv and WORKDIR/scaling.png and prints the table.
"""

import csv
import json
import math
import os
import statistics
import sys
from pathlib import Path

import jax

from research import environment, validate
from research import main as main_lib
from research import workdir as workdir_lib
from research.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, UserError
from tools.measure import Stopped, run_child

MIN_SCALING_STEPS = 15  # the report skips the first two log intervals (warm-up)
COLUMNS = [
  "config",
  "mode",
  "n_devices",
  "global_batch",
  "per_device_batch",
  "examples_per_sec",
  "sec_per_batch",
  "speedup",
  "efficiency",
  "input_wait_fraction",
  "final_loss",
  "eval_accuracy",
]


def device_counts(n: int) -> list[int]:
  """1, 2, 4, … up to n, and n itself."""
  counts = [1]
  while counts[-1] * 2 <= n:
    counts.append(counts[-1] * 2)
  return counts if counts[-1] == n else [*counts, n]


def check_config(config, n_devices: int) -> None:
  """Every device count the report will run, checked before the first one starts."""
  if config.scaling_steps < MIN_SCALING_STEPS:
    raise UserError(
      f"scaling_steps={config.scaling_steps} is too few to measure; use at least "
      f"{MIN_SCALING_STEPS}"
    )
  counts = device_counts(n_devices)
  fields = ("batch_size", "eval_batch_size") if config.scaling_strong else ("eval_batch_size",)
  for field in fields:  # weak scaling sets batch_size per count; these stay as they are
    if bad := [n for n in counts if config[field] % n]:
      raise UserError(
        f"the scaling report runs {field}={config[field]} on {counts} devices; it does not "
        f"divide over {bad[0]}; use a multiple of {math.lcm(*counts)}"
      )


def _measure(spec, overrides, workdir: Path, n_devices: int, batch: int, config, backend):
  """Trains in a child process and reads its steady-state throughput back."""
  steps = config.scaling_steps
  args = [
    f"--workdir={workdir}",
    *(f"--config.{field}={value}" for field, value in overrides),
    "--config.scaling_report=False",
    f"--config.batch_size={batch}",
    f"--config.num_train_steps={steps}",
    f"--config.log_every_steps={max(1, steps // 5)}",
    "--config.checkpoint_every_steps=0",
    "--config.checkpoint_every_epochs=0",
    "--config.eval_every_steps=0",
    "--config.eval_every_epochs=0",
  ]
  command = [sys.executable, "-m", "research.main", f"--config={spec}", *args]
  log = workdir.with_name(f"{workdir.name}.log")
  log.parent.mkdir(parents=True, exist_ok=True)
  with open(log, "w") as out:  # a SIGTERM to this report stops the child first (run_child)
    env = environment.for_devices(n_devices, backend)
    code = run_child(command, env=env, stdout=out, stderr=out)
  if code:
    raise UserError(f"the {n_devices}-device run failed: {log.read_text().strip()[-500:]}")
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "loss" in r][2:]  # skip step 1 and warm-up
  return {
    "n_devices": n_devices,
    "global_batch": batch,
    "per_device_batch": batch // n_devices,
    "examples_per_sec": statistics.median(r["examples_per_sec"] for r in train),
    "sec_per_batch": statistics.median(r["sec_per_batch"] for r in train),
    "input_wait_fraction": statistics.median(r["input_wait_fraction"] for r in train),
    "final_loss": train[-1]["loss"],  # at the last step
    "eval_accuracy": [r for r in records if "eval_accuracy" in r][-1]["eval_accuracy"],
  }


def _with_speedups(rows: list[dict], mode: str) -> list[dict]:
  base = rows[0]["examples_per_sec"] / rows[0]["n_devices"]
  return [
    {
      "mode": mode,
      **r,
      "speedup": r["examples_per_sec"] / rows[0]["examples_per_sec"],
      "efficiency": r["examples_per_sec"] / (base * r["n_devices"]),
    }
    for r in rows
  ]


def _plot(rows: list[dict], path: Path) -> None:
  import matplotlib
  import matplotlib.ticker

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax_tp, ax_speed) = plt.subplots(1, 2, figsize=(11, 4.2))
  for mode in dict.fromkeys(r["mode"] for r in rows):
    sel = [r for r in rows if r["mode"] == mode]
    n = [r["n_devices"] for r in sel]
    ax_tp.plot(n, [r["examples_per_sec"] for r in sel], "o-", label=f"{mode} scaling")
    ax_speed.plot(n, [r["speedup"] for r in sel], "o-", label=f"{mode} scaling")
  n_all = sorted({r["n_devices"] for r in rows})
  ax_speed.plot(n_all, n_all, "k--", label="ideal")
  for ax, title, ylabel in (
    (ax_tp, "throughput", "examples / s"),
    (ax_speed, "speedup over 1 device", "speedup"),
  ):
    ax.set(title=title, xlabel="devices", ylabel=ylabel)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(n_all))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.grid(alpha=0.3)
    ax.legend()
  kind = jax.devices()[0].device_kind
  where = f"{kind} GPUs" if jax.default_backend() == "gpu" else f"CPU, {os.cpu_count()} cores"
  fig.suptitle(f"{rows[0]['config']} on {where}")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def run(config, spec: str, overrides: list, workdir: Path) -> list[dict]:
  """Runs the report for the training config `spec` (+ overrides) into `workdir`."""
  backend, n_max = jax.default_backend(), jax.local_device_count()
  per_device = config.batch_size // n_max  # check_config checked every count
  # Every report runs fresh children: a rerun into the same workdir never reads old numbers.
  children = workdir / "scaling" / f"run-{len(list(workdir.glob('scaling/run-*'))) + 1}"
  print(f"scaling report: each device count trains in {children}/MODE-N", flush=True)
  rows, runs = [], {}  # runs: (devices, global batch) → its measurement
  modes = {"weak": lambda n: per_device * n}
  if config.scaling_strong:
    modes["strong"] = lambda n: config.batch_size
  for mode, batch_for in modes.items():
    measured = []
    for n in device_counts(n_max):
      batch = batch_for(n)
      if (n, batch) in runs:  # on all devices both modes train the config's global batch
        print(f"scaling ({mode}): {n} devices, global batch {batch}: measured above", flush=True)
      else:
        print(f"scaling ({mode}): {n} devices, global batch {batch} ...", flush=True)
        run_dir = children / f"{mode}-{n}"
        runs[n, batch] = _measure(spec, overrides, run_dir, n, batch, config, backend)
      measured.append(runs[n, batch])
    rows += [{**r, "config": spec} for r in _with_speedups(measured, mode)]

  with open(workdir / "scaling.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  _plot(rows, workdir / "scaling.png")
  print(
    f"\n{'mode':6} {'devices':>7} {'batch':>6} {'examples/s':>11} {'s/batch':>8} "
    f"{'speedup':>8} {'efficiency':>10} {'input wait':>10} {'final loss':>10} {'eval acc':>8}"
  )
  for r in rows:
    print(
      f"{r['mode']:6} {r['n_devices']:7d} {r['global_batch']:6d} {r['examples_per_sec']:11.1f} "
      f"{r['sec_per_batch']:8.3f} {r['speedup']:8.2f} {r['efficiency']:10.0%} "
      f"{r['input_wait_fraction']:10.1%} {r['final_loss']:10.4f} {r['eval_accuracy']:8.2%}"
    )
  print(f"\nwrote {workdir / 'scaling.csv'} and {workdir / 'scaling.png'}")
  return rows


def main(argv: list[str]) -> int:
  """`./launch.sh CONFIG --config.scaling_report=True ...`: the report for one config."""
  try:
    environment.check({**environment.CORE, **environment.PLOTS})
    args, overrides = main_lib.parse_args(argv)
    config = main_lib.load_config(args, overrides)
    n_devices = jax.local_device_count()
    validate.train_config(config, n_devices)
    check_config(config, n_devices)  # every device count, up front
    workdir = main_lib.checked_workdir(args, config)
    with workdir_lib.write_errors_are_user_errors(workdir):
      workdir_lib.prepare(workdir, config)
      run(config, args.config, overrides, workdir)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USER_ERROR
  except (Stopped, KeyboardInterrupt) as e:
    why = "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else "stopped (SIGTERM)"
    print(f"scaling report {why} before it measured every device count; nothing written")
    return EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else 0
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
