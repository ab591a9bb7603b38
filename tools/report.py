"""Measures the results (README, docs/results.md) on the accelerator at hand, recording each number.

  ./launch.sh report                        # every part; each resumes where it stopped
  ./launch.sh report --only main            # one part (or one measurement: --only main:NAME)
  ./launch.sh report --data DIR             # CIFAR-10 as an image folder, or a .tar.gz of one
  ./launch.sh report --render               # only re-render the tables and the plot

Parts, at GPU sizes (a CPU host runs the same parts at CPU sizes, so the report is tested):
  throughput  each training config's step, float32 and bfloat16, at its default global batch
              and at the largest that fits (or the largest timed before the budget ran out,
              as its row says): examples/s (on a GPU the median of 5 timings, their range
              in the row), and FLOPs per step (XLA's CPU cost analysis of
              the step lowered with XLA's own ops: measure.model_flops) over the device's
              peak (MFU).
  peer        the same networks' training steps in PyTorch on the same device, when torch
              imports (tools/peer_torch.py): our examples/s ÷ theirs. On a CUDA GPU, the
              speedrun against airbench94_muon and against hiverge's cifar10_speedrun, the
              record holder (tools/peer_airbench.py; each script is fetched apart, --airbench
              PATH, --hiverge PATH): 3 runs of each on the same pixels in one invocation,
              our span ÷ theirs.
  streamed    Inception-v3 in bfloat16 on generated ImageNet-sized JPEGs, streamed through as
              many decode workers as the host has cores: examples/s, input wait, and one
              worker's decode rate.
  main        the recipes trained to completion on real CIFAR-10: test accuracy, wall time,
              examples/s and the eval curve.
Each measurement writes one JSON record, results/<machine>/<part>-<name>.json; one already
recorded is skipped (`--again` redoes it). A part stops starting measurements once `--budget`
seconds have passed, and a training run is stopped (SIGTERM: it checkpoints) at the budget and
resumed by the next invocation, so every invocation fits a 10-minute slot. A SIGTERM or Ctrl-C
to the report reaches the training run first: it checkpoints, and the next invocation resumes it.
A training run that fails stops the report (exit 2). `--scale=tiny` runs the parts at the
tests' sizes and records into WORKDIR/results, never into the README's tables.
"""

import argparse
import json
import os
import shlex
import shutil
import sys
import tarfile
import time
from pathlib import Path

from research import environment, host_memory
from research.errors import EXIT_USER_ERROR, UserError
from tools import measure, results
from tools.measure import Measurement

ROOT = Path(__file__).parent.parent
PARTS = ("throughput", "peer", "streamed", "main")


def _dtypes(part, stem, label, config, **kwargs) -> list[Measurement]:
  return [
    Measurement(part, f"{stem}-{dtype}", label, config, (("model.dtype", dtype),), **kwargs)
    for dtype in ("float32", "bfloat16")
  ]


def _seeds(stem, label, config, seeds: int, dtype: str) -> list[Measurement]:
  """One training run per seed, each its own record."""
  return [
    Measurement(
      "main", f"{stem}-seed{s}", f"{label}, seed {s}", config, (("model.dtype", dtype), ("seed", s))
    )
    for s in range(seeds)
  ]


def plan(scale: str, cores: int) -> list[Measurement]:
  """What the report measures at `scale`: "gpu", "cpu" (small sizes) or "tiny" (the tests)."""
  vgg, keras, inception, speedrun = (
    "configs/cifar_vgg.py",
    "configs/cifar_keras_cnn.py",
    "configs/inception_v3.py",
    "configs/cifar_speedrun.py",
  )
  m = []
  if scale == "gpu":
    # A GPU's step takes milliseconds: 5 timings each, the median recorded
    timed = dict(steps=50, rounds=5)
    m += _dtypes("throughput", "cifar_vgg", "VGG-16", vgg, **timed, search_batch=True)
    m += _dtypes("throughput", "cifar_keras_cnn", "Keras CNN", keras, **timed, search_batch=True)
    m += _dtypes(
      "throughput", "inception_v3", "Inception-v3 299²", f"{inception}:synthetic", steps=30,
      rounds=5,
    )  # fmt: skip
    m += _dtypes("peer", "vgg16_bn", "VGG-16-BN", vgg, **timed, peer="vgg")
    m += _dtypes("peer", "keras_cnn", "Keras CNN", keras, **timed, peer="keras_cnn")
    m += _dtypes(
      "peer", "inception_v3", "Inception-v3 299²", f"{inception}:synthetic", steps=30,
      rounds=5, peer="inception_v3", image_size=299,
    )  # fmt: skip
    streamed = (("model.dtype", "bfloat16"), ("data_workers", cores), ("model.num_classes", 10))
    m.append(Measurement("streamed", "inception_v3", "Inception-v3", inception, streamed, steps=60))
    bf16 = (("model.dtype", "bfloat16"),)
    recipes = (  # ours, and hiverge's recipe as our variant
      ("cifar_speedrun", "Speedrun (8 epochs)", speedrun),
      ("cifar_speedrun_hiverge", "Speedrun, hiverge's recipe (243 steps)", f"{speedrun}:hiverge"),
    )
    for stem, title, config in recipes:
      for peer, script in measure.SPEEDRUN_PEERS.items():
        label = f"{title} against {script.title}"
        m.append(Measurement("peer", f"{stem}-{peer}", label, config, bf16, 3, peer=peer))
    m += _dtypes("main", "cifar_vgg", "VGG-16 (200 epochs)", vgg)
    for stem, title, config in recipes:
      m += _seeds(f"{stem}-bfloat16", title, config, 10, "bfloat16")
    for seeds in (4, 8):  # the seeds 0 to N - 1 in one program (docs/sweeps.md), each mode
      for mode, how in (("unroll", ""), ("vmap", ", batched (vmap)")):
        m.append(
          Measurement(
            "main",
            f"cifar_speedrun-bfloat16-seeds{seeds}" + ("-vmap" if mode == "vmap" else ""),
            f"Speedrun (8 epochs), {seeds} seeds in one program{how}",
            speedrun,
            bf16 + (("seeds", seeds),) + ((("seeds_mode", mode),) if mode == "vmap" else ()),
          )
        )
  elif scale == "cpu":
    m += _dtypes("throughput", "cifar_keras_cnn", "Keras CNN", keras, steps=10)
    m += _dtypes("throughput", "cifar_vgg", "VGG-16", vgg, steps=4)
    m += _dtypes(
      "throughput", "inception_v3_smoke", "Inception-v3 :smoke", f"{inception}:smoke", steps=10
    )
    m += [x for x in _dtypes("peer", "keras_cnn", "Keras CNN", keras, steps=10, peer="keras_cnn")]
    m += _dtypes("peer", "vgg16_bn", "VGG-16-BN", vgg, steps=4, peer="vgg")
    streamed = (
      ("model.dtype", "bfloat16"), ("data_workers", cores), ("batch_size", 32),
      ("log_every_steps", 5), ("checkpoint_every_steps", 0),
    )  # fmt: skip
    m.append(
      Measurement(
        "streamed",
        "inception_v3_smoke",
        "Inception-v3 :smoke",
        f"{inception}:smoke",
        streamed,
        steps=30,
      )
    )
    keras_main = (("num_epochs", 10), ("eval_every_epochs", 1.0))
    m.append(
      Measurement("main", "cifar_keras_cnn-10ep", "Keras CNN (10 epochs)", keras, keras_main)
    )
    m += _seeds("cifar_speedrun", "Speedrun (8 epochs)", speedrun, 3, "float32")
  elif scale == "tiny":
    smoke = "configs/cifar_vgg.py:smoke"
    m += _dtypes(
      "throughput", "vgg_smoke", "VGG :smoke", smoke, steps=2, rounds=2, search_batch=True,
      search_up_to=2,
    )  # fmt: skip
    m += _dtypes("peer", "vgg_smoke", "VGG :smoke", smoke, steps=2, peer="vgg")
    streamed = (
      ("augment", "inception_crop(32)|flip_lr"), ("eval_preprocess", "central_crop(32)"),
      ("host_image_size", 40), ("data_workers", 1), ("batch_size", 16), ("eval_batch_size", 16),
      ("log_every_steps", 2), ("checkpoint_every_steps", 0),
    )  # fmt: skip
    m.append(Measurement("streamed", "vgg_smoke", "VGG :smoke", smoke, streamed, steps=6))
    tiny_main = (("num_train_steps", 6), ("eval_every_steps", 2), ("log_every_steps", 2))
    m.append(Measurement("main", "vgg_smoke", "VGG :smoke", smoke, tiny_main))
  else:
    raise UserError(f"--scale={scale} is not gpu, cpu or tiny")
  return m


# --- the command -----------------------------------------------------------------------------


def image_folder(data: str) -> Path | None:
  """The image folder `--data` names (a .tar.gz of one is extracted once to the data cache);
  None without `--data`."""
  from research.data import CACHE

  if not data:
    return None
  path = Path(data).expanduser()
  if not path.exists():
    raise UserError(f"--data={data} does not exist; give an image folder or a .tar.gz of one")
  if path.is_dir():
    return path
  if not path.name.endswith((".tar.gz", ".tgz", ".tar")):
    raise UserError(f"--data={data} is neither a directory nor a .tar.gz archive")
  target = CACHE / "report" / path.name.split(".")[0]
  if not (target / ".complete").exists():
    print(f"extracting {path} to {target} (once) ...", flush=True)
    target.mkdir(parents=True, exist_ok=True)
    try:
      with tarfile.open(path) as tar:
        tar.extractall(target, filter="data")
    except (tarfile.TarError, EOFError, OSError) as e:
      shutil.rmtree(target, ignore_errors=True)  # nothing half-extracted is left
      raise UserError(f"cannot extract --data={data} ({e}); give an intact .tar.gz") from None
    (target / ".complete").touch()
  roots = [p.parent for p in target.rglob("train") if p.is_dir()]
  if not roots:
    raise UserError(f"{path} holds no train/ directory; an image folder is train/<class>/*")
  return min(roots, key=lambda p: len(p.parts))


# Rough minutes per measurement, said before a part starts (main: from this machine's
# throughput record when there is one).
ROUGH_MINUTES = {
  "gpu": {"throughput": 2.0, "peer": 1.5, "streamed": 3.0},
  "cpu": {"throughput": 2.0, "peer": 2.0, "streamed": 3.0},
  "tiny": {"throughput": 0.2, "peer": 0.2, "streamed": 0.3, "main": 0.3},
}


def _rough_minutes(m: Measurement, scale: str, machine: Path) -> str:
  if m.peer in measure.SPEEDRUN_PEERS:
    return "a few minutes: PyTorch compiles with max-autotune, then 3 runs of each recipe"
  if m.part != "main" or scale == "tiny":
    return f"~{ROUGH_MINUTES[scale][m.part]:g} min"
  stem = m.name.split("-")[0]
  measured = results.record_path(machine, "throughput", f"{stem}-{m.dtype}")
  if not measured.exists():
    return f"no time estimate: no throughput record of {stem}, {m.dtype} on this machine"
  config = m.config_dict()
  speed = json.loads(measured.read_text())["numbers"]["examples_per_sec"]
  steps = config.num_train_steps if config.num_train_steps > 0 else config.num_epochs * 195
  return f"~{steps * config.batch_size / speed / 60:.0f} min of training at {speed:,.0f} examples/s"


def _prepare(args):
  """(scale, device, the measurements chosen, those not recorded yet, the real data)."""
  import jax

  scale = args.scale or ("cpu" if jax.default_backend() == "cpu" else "gpu")
  device = measure.device_info()
  machine_dir = Path(args.results) / measure.machine_of(device)
  cores = os.cpu_count() or 1
  named = lambda m: not args.only or args.only in (m.part, f"{m.part}:{m.name}")
  chosen = [m for m in plan(scale, cores) if named(m)]
  if not chosen:
    others = [o for o in ("gpu", "cpu") if o != scale]
    elsewhere = [o for o in others if any(map(named, plan(o, cores)))]
    where = f"; it is in the {elsewhere[0]} plan (--scale={elsewhere[0]})" if elsewhere else ""
    part = args.only.split(":")[0]
    names = [f"{m.part}:{m.name}" for m in plan(scale, cores) if m.part == part]
    if names:
      choices = f"{part}'s measurements: {', '.join(names)}"
    else:
      choices = f"parts: {', '.join(PARTS)}"
    raise UserError(
      f"--only={args.only} names no measurement of the {scale} plan{where}; {choices}"
    )
  trains = lambda m: m.part == "main" or m.peer in measure.SPEEDRUN_PEERS  # on real CIFAR-10
  data = image_folder(args.data) if any(map(trains, chosen)) else None
  recorded = lambda m: results.record_path(machine_dir, m.part, m.name).exists()
  todo = [m for m in chosen if (args.again or not recorded(m))]
  todo = [m for m in todo if not (trains(m) and data is None)]
  print(f"report on {results.hardware({'device': device})} ({scale} sizes) into {machine_dir}")
  for m in chosen:
    state = "to measure" if m in todo else "recorded (--again redoes it)"
    if trains(m) and data is None:
      state = "skipped: no real CIFAR-10 here (pass --data DIR or a .tar.gz of the JPEG folder)"
    print(f"  {m.part:10} {m.name:26} {state}; {_rough_minutes(m, scale, machine_dir)}")
  print(f"each part stops starting measurements after --budget={args.budget:g} s", flush=True)
  return scale, device, todo, data


def run(args) -> int:
  """Measures what `args` asks for; returns the exit code."""
  if not args.only:  # the plan, then each part in a process of its own
    children = dict(os.environ)
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # this process only looks
    _prepare(args)
    forwarded = [a for a in sys.argv[1:] if not a.startswith("--only")]
    for part in PARTS:
      command = [sys.executable, "-m", "tools.report", f"--only={part}", *forwarded]
      if code := measure.run_child(command, env=children):
        return code
    return 0
  if args.only.startswith("peer"):  # JAX takes device memory as it needs it, leaving PyTorch room
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  scale, device, todo, data = _prepare(args)
  workdirs = Path(args.workdir) / measure.machine_of(device)
  try:  # the tables follow the records written, even when a measurement fails
    for part in PARTS:
      pending = [m for m in todo if m.part == part]
      if not pending:
        continue
      budget_end = time.time() + args.budget
      if part == "peer":
        try:
          import torch  # noqa: F401
        except ImportError:
          print("peer: skipped, torch does not import here", flush=True)
          continue
      for i, m in enumerate(pending):
        if i and time.time() > budget_end:
          print(f"{part}: budget spent; run the report again for the rest", flush=True)
          break
        print(f"{part} {m.name}: {m.label}, {m.dtype} ...", flush=True)
        workdir = workdirs / f"{part}-{m.name}"
        recorded = results.record_path(Path(args.results) / workdirs.name, part, m.name)
        if args.again and recorded.exists():  # its runs are the record's: measured anew
          recorded.unlink()
          shutil.rmtree(workdir, ignore_errors=True)
          print(f"  --again: removed {recorded} (git has it) and its runs in {workdir}", flush=True)
        if part == "throughput":
          records = measure.throughput(m, device, budget_end)
        elif m.peer in measure.SPEEDRUN_PEERS:
          script = Path(getattr(args, m.peer))
          if skipped := _speedrun_peer_missing(m.peer, script):
            print(f"peer {m.name}: skipped, {skipped}", flush=True)
            continue
          records = measure.speedrun_peer(m, device, workdir, budget_end, data, script)
        elif part == "peer":
          records = measure.peer(m, device, measure.peer_speed(m))
        elif part == "streamed":
          records = measure.streamed(m, device, workdir, budget_end, scale)
        else:
          records = measure.main_run(m, device, workdir, budget_end, data)
        for record in records:
          print(f"  wrote {results.write(record, args.results)}", flush=True)
  finally:
    if _into_readme(args.results):
      render()
  return 0


def _into_readme(folder: str) -> bool:
  """Whether records written to `folder` are the README's (results/)."""
  return Path(folder).resolve() == results.RESULTS.resolve()


def _speedrun_peer_missing(peer: str, script: Path) -> str:
  """Why the speedrun peer cannot run here, or "" if it can: it needs the script (never part
  of this project) and PyTorch with a CUDA GPU."""
  import torch

  if not torch.cuda.is_available():
    return f"{measure.SPEEDRUN_PEERS[peer].script} runs on a CUDA GPU only"
  if not script.is_file():
    return f"no {script} (--{peer} PATH; docs/gpu_hosts.md says where to get it)"
  return ""


def render() -> None:
  """Rewrites the README's summary, docs/results.md's and BENCHMARKS.md's tables and the plot
  from results/."""
  records = results.load()
  for path, text in results.rendered(records, expected_rows()).items():
    path.write_text(text)
  results.plot(records)
  print(f"rendered the tables in README.md, docs/results.md and BENCHMARKS.md, and {results.PLOT}")


def expected_rows() -> list[dict]:
  """The table's rows for the recipes each kind of machine trains, measured or not yet."""
  rows = []
  for scale, hardware in (("gpu", "a GPU"), ("cpu", "a CPU host")):
    for m in plan(scale, 1):
      if m.part == "main":
        args = measure.train_command(m, {"dataset": "folder", "data_dir": "DIR"})
        command = "./launch.sh " + shlex.join(args)
      elif m.peer in measure.SPEEDRUN_PEERS:
        command = measure.speedrun_peer_command(m)
      else:
        continue
      rows.append(
        {
          "name": m.name,
          "label": m.label,
          "dtype": m.dtype,
          "dataset": "cifar10-jpeg (50,000 train, 10,000 test)",
          "platform": scale,
          "hardware": hardware,
          "command": command,
        }
      )
  return rows


def main() -> int:
  host_memory.keep_freed_memory()  # before JAX starts its threads
  parser = argparse.ArgumentParser(prog="launch.sh report", description=__doc__.split("\n\n")[0])
  parser.add_argument("--only", default="", help="a part, or PART:NAME for one measurement")
  parser.add_argument("--data", default="", help="CIFAR-10 as an image folder or its .tar.gz")
  parser.add_argument("--budget", type=float, default=540.0, help="seconds per part")
  parser.add_argument("--again", action="store_true", help="redo recorded measurements")
  parser.add_argument("--render", action="store_true", help="only re-render tables and plot")
  parser.add_argument(
    "--scale",
    choices=("gpu", "cpu", "tiny"),
    help="default: the backend's; tiny (the tests' sizes) records into WORKDIR/results, not the "
    "README's tables",
  )
  parser.add_argument("--results", default=str(results.RESULTS), help=argparse.SUPPRESS)
  parser.add_argument("--workdir", default="runs/report", help="where the runs train")
  for peer, script in measure.SPEEDRUN_PEERS.items():
    parser.add_argument(
      f"--{peer}", default=str(ROOT / script.script), help=f"the peer: {script.script}"
    )
  args = parser.parse_args()
  try:
    if not args.budget > 0:
      raise UserError(f"--budget={args.budget:g}: give the seconds a part may take, above 0")
    if args.scale == "tiny" and _into_readme(args.results):
      args.results = str(Path(args.workdir) / "results")  # toy numbers stay out of the README
    environment.check({**environment.CORE, **environment.PLOTS})
    if args.render:
      render()
      return 0
    return run(args)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USER_ERROR
  except (measure.Stopped, KeyboardInterrupt) as e:
    why = "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else "stopped (SIGTERM)"
    print(f"report {why}; a training run stops at a checkpoint: run the report again to go on")
    return 130 if isinstance(e, KeyboardInterrupt) else 0


if __name__ == "__main__":
  sys.exit(main())
