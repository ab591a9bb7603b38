"""Benchmarks that print RATIOS measured within one run (the machines are shared and noisy).

  ./launch.sh bench                 # the configs as they are (for GPU hosts)
  ./launch.sh bench --small         # smaller models and batches, for a CPU

  loop efficiency       full training loop examples/s ÷ the bare pmapped step on the same
                        device-resident data (goal ≥ 0.97): what logging, metrics fetches
                        and the Python loop cost.
  augmentation overhead bare step with the config's augmentation ÷ with only its
                        deterministic part (goal ≥ 0.95).
  on-device vs host     the same crop/shift/flip done with NumPy in host worker processes
                        and shipped to the devices every step (the Keras write-up's way) ÷
                        on device: examples/s of host ÷ device.
  conv2d                steady-state lax.conv on 1 device vs scipy.signal.convolve2d in a
                        Python loop, on the conv2d write-up's workload.
  cpu                   (on a CPU host) the Keras CNN and VGG train steps at global batch 128
                        and 256: examples/s of this codebase's step (its CPU convolutions,
                        the auto micro-batch) ÷ the same step with XLA's convolutions on the
                        whole batch (what a plain jitted flax step does), in this process's
                        devices (1 on a CPU host unless XLA_FLAGS says otherwise).
  forms                 each form of research/cpu_forms.py on and off in the shipped default
                        steps (Keras CNN, VGG-16, Inception-v3 :smoke; --configs): each the
                        backend uses switched off alone, each other switched on alone, and
                        XLA's own ops, against the backend's default; and the host-memory
                        settings. Compiled in one process,
                        timed in alternating rounds (malloc in alternating processes).
  seeds                 a config's bare step with --seeds=N (default 1,4) in one program,
                        batched (vmap) and traced apart (unroll): seconds per
                        seed-step ÷ those of one seed's step, timed in alternating rounds
                        after all compiled (the price of a seed).
  sweep                 the same for a sweep of N learning rates (--seeds=N, one seed): a
                        point's training step ÷ a single run's (the price of a point).
All training benchmarks use the synthetic dataset (same shapes as CIFAR-10; throughput of
resident data does not depend on pixel values). Results go to the console at the end and to
WORKDIR/benchmark.json after each measurement (its "finished" false until all have run): a
bench stopped early keeps what it measured.
"""

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np
from PIL import Image

from research import configuration, cpu_forms, host_memory, host_workers
from research import inputs as inputs_lib
from research import workdir as workdir_lib
from research.data import folder
from research.errors import EXIT_USER_ERROR, UserError, exit_interrupted
from research.placement import replicate
from research.setup import setup
from research.steps import AXIS, train_step
from research.train import compile_step, train_and_evaluate
from tools import measure

GOALS = {"loop_efficiency": 0.97, "augmentation_overhead": 0.95}
CONFIGS = ("configs/cifar_vgg.py", "configs/cifar_keras_cnn.py")
SMALL = {  # --small: sizes a 2-core CPU measures in minutes
  "configs/cifar_vgg.py": dict(batch_size=64, model=dict(depth=11, width=0.25)),
  "configs/cifar_keras_cnn.py": dict(batch_size=64),
}


def _config(path: str, small: bool, **overrides):
  config = configuration.load(path)
  config.update(dataset="synthetic", synthetic_train_size=8192)
  config.update(checkpoint_every_steps=0, checkpoint_every_epochs=0.0)
  if small:
    config.update(SMALL[path])
  config.update(
    synthetic_test_size=config.eval_batch_size,
    eval_every_steps=0,
    eval_every_epochs=0.0,
    **overrides,
  )
  return config


def _bare(config):
  """(training, step, its compiled program, the replicated state, the batches): the config's
  step as its run compiles it (train.compile_step), alone: no logging, no fetches. Its first
  program every call (a run switches to one without a frozen group's gradient later:
  Training.later_steps), one step a call."""
  training = dataclasses.replace(setup(config), later_steps=(), steps_per_call=1)
  rstate, batches = replicate(training.state), training.inputs.batches(0)
  first = next(batches)
  step, program = compile_step(training, rstate, first)
  return training, step, program, rstate, itertools.chain([first], batches)


def bare_step(config, steps: int) -> float:
  """Examples/s of the pmapped step alone on device-resident data: no logging, no fetches."""
  _, step, _, rstate, batches = _bare(config)
  seconds, _ = measure.time_steps(step, rstate, batches, steps)
  return steps * config.batch_size / seconds


def full_loop(config, steps: int, workdir: Path) -> float:
  """Examples/s the training loop itself reports, over its intervals after warm-up."""
  interval = max(1, steps // 4)
  config.update(num_train_steps=3 + 4 * interval, log_every_steps=interval)
  train_and_evaluate(config, str(workdir))
  records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "loss" in r][2:]  # not step 1, not the warm-up interval
  return statistics.median(r["examples_per_sec"] for r in train)


def _steady_examples_per_sec(config, seconds: float = 10.0) -> tuple[float, int]:
  """Examples/s of the bare step over about `seconds` after 5 warm-up steps; the micro-batch.

  Five: the compile, then the steps in which the host heap grows to the step's peak (their
  memory is new to the process; see research/host_memory.py); the last one sizes the run.
  """
  training, step, _, rstate, batches = _bare(config)
  for _ in range(5):
    start = time.perf_counter()
    rstate, metrics = step(rstate, next(batches))
    jax.block_until_ready(metrics)
  steps = max(2, min(20, round(seconds / (time.perf_counter() - start))))
  timed, _ = measure.time_steps(step, rstate, batches, steps, warmup=0)
  return steps * config.batch_size / timed, training.micro_batch


def cpu_steps(path: str) -> dict:
  """This codebase's CPU step vs XLA's convolutions on the whole batch, at batch 128 and 256."""
  rows = {}
  for batch in (128, 256):
    per_device = batch // jax.device_count()
    with cpu_forms.without_cpu_forms():
      xla, _ = _steady_examples_per_sec(
        _config(path, False, batch_size=batch, micro_batch_size=per_device)
      )
    ours, micro_batch = _steady_examples_per_sec(_config(path, False, batch_size=batch))
    rows[str(batch)] = {
      "devices": jax.device_count(),
      "micro_batch": micro_batch,
      "xla_examples_per_sec": xla,
      "examples_per_sec": ours,
      "speedup": ours / xla,
    }
  return rows


def seeds_cost(
  path: str, small: bool, counts, rounds: int, seconds=6.0, axis="seeds", **overrides
) -> dict:
  """Seconds per step of the bare step of `path` with each of `counts` points in one program
  (`axis` "seeds": seeds; "sweep": a sweep of that many learning rates, one seed), the points
  batched (vmap) and traced apart (unroll), compiled first and then timed in `rounds`
  alternating rounds; per point-step ÷ one run's step. `overrides`: config fields."""
  runs = {}
  for count in counts:
    for mode in ("vmap", "unroll") if count > 1 else ("unroll",):
      name = f"{count} {mode}" if count > 1 else str(count)
      points = {"seeds": count} if axis == "seeds" else _learning_rates(path, count)
      config = _config(path, small, seeds_mode=mode, **points, **overrides)
      _, p_step, _, rstate, batches = _bare(config)
      _, rstate = measure.time_steps(
        p_step, rstate, batches, 1, warmup=4
      )  # compiled, the heap grown
      runs[name] = [p_step, rstate, batches, count]
  one_step = {}
  for name, run in runs.items():  # about `seconds` a round for each
    took, run[1] = measure.time_steps(run[0], run[1], run[2], 2, warmup=0)
    one_step[name] = took / 2
  timed = {name: [] for name in runs}
  for _ in range(rounds):
    for name, run in runs.items():
      steps = max(2, round(seconds / one_step[name]))
      took, run[1] = measure.time_steps(run[0], run[1], run[2], steps, warmup=0)
      timed[name].append(took / steps)
  per_seed = {name: statistics.median(t) / runs[name][3] for name, t in timed.items()}
  first = next(iter(runs))
  return {
    name: {
      "sec_per_step": per_seed[name] * runs[name][3],
      "sec_per_seed_step": per_seed[name],
      "per_seed_step_vs_one": per_seed[name] / per_seed[first],
    }
    for name in runs
  }


def _learning_rates(path: str, count: int) -> dict:
  """The config fields of a sweep of `count` learning rates around `path`'s (1: none)."""
  rate = configuration.load(path).learning_rate
  rates = ",".join(f"{rate * 2 ** (i - count // 2):g}" for i in range(count))
  return {"sweep": f"learning_rate={rates}"} if count > 1 else {}


FORM_CONFIGS = (
  "configs/cifar_keras_cnn.py",
  "configs/cifar_vgg.py",
  "configs/inception_v3.py:smoke",
)


def form_variants() -> dict:
  """{name: (the forms switched off, the forms switched on)}, the backend's default first: each
  form the backend uses by default switched off alone ("no FORM"), each other switched on alone
  ("with FORM"), then "none" (XLA's own ops throughout) and "all"."""
  defaults = cpu_forms.DEFAULT_FORMS.get(jax.default_backend(), ())
  others = [f for f in cpu_forms.FORMS if f not in defaults]
  return {
    "default": ((), ()),
    **{f"no {f}": ((f,), ()) for f in defaults},
    **{f"with {f}": ((), (f,)) for f in others},
    "none": (cpu_forms.FORMS, ()),
    "all": ((), cpu_forms.FORMS),
  }


def form_gains(path: str, variants: list[str], rounds: int, seconds: float = 6.0) -> dict:
  """Examples/s of the config's default step for each variant of form_variants(), all
  compiled in this process first, then timed in `rounds` alternating rounds (the order
  reversed every other round); a variant compiled to the same program as the backend's
  default (its form does not occur in this model) is not timed. The gain of a variant: the
  default's speed ÷ the variant's (above 1: the default is faster), taken within each round."""
  default = next(iter(form_variants()))
  compiled, programs = {}, {}
  for name in variants:
    off, on = form_variants()[name]
    with cpu_forms.without_cpu_forms(*off) if off else _nothing(), cpu_forms.with_forms(*on):
      _, p_step, program, rstate, batches = _bare(_config(path, False))  # with these forms
    programs[name] = program.as_text()
    if name != default and programs[name] == programs.get(default):
      continue
    per_step, rstate = measure.time_steps(p_step, rstate, batches, 1, warmup=3)  # the heap grows
    compiled[name] = [p_step, rstate, batches, max(1, round(seconds / per_step))]
  speeds = {name: [] for name in compiled}
  batch = _config(path, False).batch_size
  for i in range(rounds):
    for name in list(compiled) if i % 2 == 0 else reversed(compiled):  # none always first
      p_step, rstate, batches, steps = compiled[name]
      timed, compiled[name][1] = measure.time_steps(p_step, rstate, batches, steps, warmup=1)
      speeds[name].append(steps * batch / timed)
  result = {"examples_per_sec": {name: statistics.median(v) for name, v in speeds.items()}}
  if default in speeds:  # what the default's forms gain over each variant's, round by round
    result["gain"] = {
      name: statistics.median(d / x for d, x in zip(speeds[default], v, strict=True))
      for name, v in speeds.items()
      if name != default
    }
  result["same_program_as_default"] = [n for n in variants if n not in compiled]
  result["rounds"] = speeds
  return result


@contextlib.contextmanager
def _nothing():
  yield


def _host_augment(args):
  """NumPy crop/shift + flip of one batch in a worker process (ImageDataGenerator-style)."""
  images, seed, pad, mode = args
  rng = np.random.default_rng(seed)
  n, h, w, _ = images.shape
  padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode=mode)
  out = np.empty_like(images)
  for i, (dy, dx) in enumerate(rng.integers(0, 2 * pad + 1, (n, 2))):
    out[i] = padded[i, dy : dy + h, dx : dx + w]
    if rng.random() < 0.5:
      out[i] = out[i, :, ::-1]
  return out


def _split_policy(spec: str):
  """The geometric ops the host can do, (pad, mode), and what stays on device."""
  ops = [p.strip() for p in spec.split("|") if p.strip()]
  geometric = [p for p in ops if p.startswith(("crop", "shift", "flip_lr"))]
  pad, mode = 4, "constant"
  for op in geometric:
    if op.startswith("shift"):
      pad, mode = round(float(op[6:-1]) * 32), "edge"
    elif op.startswith("crop"):
      pad = int(op[5:-1].split(",")[0])
  return (pad, mode), "|".join(p for p in ops if p not in geometric)


def host_augmented(config, steps: int, workers: int) -> float:
  """Examples/s when worker processes augment every batch on the host, as in the write-up."""
  (pad, mode), on_device = _split_policy(config.augment)
  device_config = config.copy_and_resolve_references()
  device_config.augment = on_device
  training = setup(device_config)
  data = np.random.default_rng(0).integers(0, 256, (8192, 32, 32, 3), dtype=np.uint8)
  labels = np.random.default_rng(1).integers(0, 10, 8192).astype(np.int32)
  b = config.batch_size
  # The same step, given host-augmented batches as a streamed dataset gives them.
  gather = functools.partial(
    inputs_lib.streamed_gather, step_key=jax.random.key(0), steps_per_epoch=len(data) // b
  )
  run = dataclasses.replace(training.run, gather=gather)
  step = jax.pmap(functools.partial(train_step, run=run), axis_name=AXIS, donate_argnums=(0,))

  def jobs():  # finite: the pool's map submits its whole input at once
    for i in range(steps + 3 + 4):  # timed + warm-up steps + what prefetch holds
      idx = np.random.default_rng(i).integers(0, len(data), b)
      yield data[idx], i, pad, mode

  with host_workers.pool(workers) as pool:
    augmented = pool.map(_host_augment, jobs())
    batches = ({"image": x, "label": labels[:b]} for x in augmented)
    on_devices = inputs_lib.prefetch_to_devices(batches, 2)
    seconds, _ = measure.time_steps(step, replicate(training.state), on_devices, steps)
  return steps * b / seconds


def conv2d_vs_scipy(repeats: int = 5) -> float:
  """scipy seconds ÷ steady lax.conv seconds on the write-up's workload (above 1: XLA wins)."""
  from research.experiments import conv2d_scaling

  config = configuration.load("configs/conv2d_scaling.py")
  images, kernel = conv2d_scaling.make_inputs(config, config.num_images)
  parts = conv2d_scaling.time_parts(images, kernel, config.padding, jax.devices()[:1], repeats)
  scipy_s, _ = conv2d_scaling.time_scipy(images, kernel, config.padding)
  return scipy_s / parts["compute_s"]


def decode_speed(workdir: Path, count: int, host_sizes=(320, 160)) -> dict:
  """Images/s of ONE process (one data worker) decoding ImageNet-sized JPEGs to host size.

  full: PIL's full-resolution decode; full + resize: that, then a bilinear resize of the
  longer side to the host size (what the stream did before); ours: folder.read_rgb, which
  lets libjpeg decode at 1/2–1/8 scale when that still covers the host size (Image.draft).
  Each is the median of 3 passes over the files, the variants interleaved pass by pass.
  """
  paths = [str(p) for p in measure.imagenet_sized_jpegs(workdir / "jpegs", count)]

  def full(path):
    with Image.open(path) as image:
      return np.asarray(image.convert("RGB"))

  def full_resize(path, size):
    with Image.open(path) as image:
      scale = size / max(image.size)
      target = (round(image.width * scale), round(image.height * scale))
      return np.asarray(image.convert("RGB").resize(target, Image.BILINEAR))

  variants = {"full": full}
  for size in host_sizes:
    variants[f"full_resize_{size}"] = functools.partial(full_resize, size=size)
    variants[f"ours_{size}"] = functools.partial(folder.read_rgb, max_side=size)
  passes = {name: [] for name in variants}
  for _ in range(3):
    for name, decode in variants.items():
      start = time.perf_counter()
      for path in paths:
        decode(path)
      passes[name].append(count / (time.perf_counter() - start))
  return {f"{name}_images_per_sec": statistics.median(v) for name, v in passes.items()}


def main() -> None:
  if "--system-malloc" not in sys.argv:
    host_memory.keep_freed_memory()  # before JAX starts its threads
  parser = argparse.ArgumentParser(prog="launch.sh bench", description=__doc__.split("\n")[0])
  parser.add_argument("--small", action="store_true", help="smaller models, for CPUs")
  parser.add_argument("--steps", type=int, default=40, help="timed steps per measurement")
  parser.add_argument("--workers", type=int, default=os.cpu_count(), help="host aug. workers")
  parser.add_argument("--workdir", default=f"runs/benchmark-{time.strftime('%Y%m%d-%H%M%S')}")
  parser.add_argument(
    "--only",
    choices=("train", "decode", "conv2d", "cpu", "forms", "seeds", "sweep"),
    help="one benchmark",
  )
  parser.add_argument(
    "--seeds", default="1,4", help="seeds, sweep: the seed (point) counts to compare"
  )
  parser.add_argument(
    "--batch_size", type=int, default=0, help="seeds, sweep: the global batch (0: the config's)"
  )
  parser.add_argument("--rounds", type=int, default=3, help="forms: alternating rounds")
  parser.add_argument("--variants", default="", help="forms: comma-separated (default: all)")
  parser.add_argument("--configs", default="", help="forms: comma-separated config specs")
  parser.add_argument(
    "--system-malloc", action="store_true", help="forms: glibc's defaults, not host_memory's"
  )
  parser.add_argument("--jpegs", type=int, default=200, help="generated JPEGs to decode")
  args = parser.parse_args()
  try:
    _check(args)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)
  workdir = Path(args.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  results = {
    "device": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
    "jax_version": jax.__version__,
    "small": args.small,
    "finished": False,
  }
  output = workdir / "benchmark.json"
  output.unlink(missing_ok=True)  # an earlier bench's, which this one's replaces

  def write() -> None:  # whole or not at all: a new file renamed over the old
    partial = output.with_suffix(".json.partial")
    partial.write_text(json.dumps(results, indent=2) + "\n")
    partial.replace(output)

  def measured(what: str) -> None:
    """Writes what is measured so far: a bench stopped early (a GPU lease's time limit, Ctrl-C)
    keeps it."""
    write()
    print(f"measured {what} ({output})", flush=True)

  try:
    run_all = args.only is None
    for path in CONFIGS if run_all or args.only == "train" else ():
      name = Path(path).stem
      bare = bare_step(_config(path, args.small), args.steps)
      loop = full_loop(_config(path, args.small), args.steps, workdir / f"loop-{name}")
      plain = bare_step(_config(path, args.small, augment="", eval_preprocess=""), args.steps)
      host = host_augmented(_config(path, args.small), args.steps, args.workers)
      results[name] = {
        "bare_step_examples_per_sec": bare,
        "loop_examples_per_sec": loop,
        "no_augment_examples_per_sec": plain,
        "host_augment_examples_per_sec": host,
        "loop_efficiency": loop / bare,
        "augmentation_overhead": bare / plain,
        "host_vs_device_augmentation": host / bare,
      }
      measured(f"train {name}")
    if run_all or args.only == "decode":
      results["decode"] = decode_speed(workdir, args.jpegs)
      measured("decode")
    if run_all or args.only == "conv2d":
      results["conv2d_scipy_over_lax_conv"] = conv2d_vs_scipy()
      measured("conv2d")
    on_cpu = jax.default_backend() == "cpu"
    if args.only == "cpu" or (run_all and on_cpu):  # full-size models on a CPU: ~10 minutes
      for path in CONFIGS:
        results.setdefault("cpu", {})[Path(path).stem] = cpu_steps(path)
        measured(f"cpu {path}")
    if args.only == "forms":
      results["malloc"] = "system" if args.system_malloc else "host_memory"
      for path in args.configs:
        results.setdefault("forms", {})[path] = form_gains(path, args.variants, args.rounds)
        measured(f"forms {path}")
    if args.only in ("seeds", "sweep"):
      for path in CONFIGS:
        batch = {"batch_size": args.batch_size} if args.batch_size else {}
        results.setdefault(args.only, {})[Path(path).stem] = seeds_cost(
          path, args.small, args.seeds, args.rounds, axis=args.only, **batch
        )
        measured(f"{args.only} {path}")
    results["finished"] = True
    write()
  except KeyboardInterrupt:
    done = f"what was measured is in {output}" if output.exists() else "nothing was measured"
    exit_interrupted(f"\ninterrupted: {done}")
  _print(results)
  print(f"wrote {output}")


def _check(args) -> None:
  """Every argument usable, before anything runs or is written; --variants and --configs
  become lists (their defaults when empty)."""
  for name in ("steps", "workers", "rounds", "jpegs"):
    if getattr(args, name) < 1:
      raise UserError(f"--{name}={getattr(args, name)}: give a number above 0")
  args.variants = [v for v in args.variants.split(",") if v] or list(form_variants())
  if unknown := sorted(set(args.variants) - set(form_variants())):
    raise UserError(
      f"--variants: no variant {', '.join(map(repr, unknown))}; there are "
      f"{', '.join(map(repr, form_variants()))}"
    )
  args.configs = [c for c in args.configs.split(",") if c] or list(FORM_CONFIGS)
  counts = args.seeds.split(",")
  if not all(c.isdecimal() and int(c) >= 1 for c in counts):
    raise UserError(f"--seeds={args.seeds!r}: give seed counts of 1 or more, e.g. 1,4")
  args.seeds = [int(c) for c in counts]
  for spec in args.configs:
    configuration.load(spec)  # a UserError names what is wrong with it
  workdir_lib.check_writable(Path(args.workdir))


def _print(results: dict) -> None:
  print(f"\n{results['device']}, JAX {results['jax_version']}, small={results['small']}")
  trained = [Path(p).stem for p in CONFIGS if Path(p).stem in results]
  if trained:
    print(
      f"{'':28} {'bare ex/s':>10} {'loop ex/s':>10} {'loop eff':>9} {'aug ovh':>8} {'host/dev':>9}"
    )
  for name in trained:
    r = results[name]
    print(
      f"{name:28} {r['bare_step_examples_per_sec']:10.1f} "
      f"{r['loop_examples_per_sec']:10.1f} {r['loop_efficiency']:9.3f} "
      f"{r['augmentation_overhead']:8.3f} {r['host_vs_device_augmentation']:9.3f}"
    )
  if trained:
    print(
      f"goals: loop efficiency >= {GOALS['loop_efficiency']}, augmentation overhead >= "
      f"{GOALS['augmentation_overhead']} (examples/s with ÷ without)"
    )
  if "decode" in results:
    d = results["decode"]
    print("JPEG decode, 500×375 quality 90, images/s of one worker process:")
    print(f"  full-resolution decode: {d['full_images_per_sec']:.0f}")
    for size in sorted({int(k.split("_")[1]) for k in d if k.startswith("ours_")}, reverse=True):
      full, ours = d[f"full_resize_{size}_images_per_sec"], d[f"ours_{size}_images_per_sec"]
      print(
        f"  to longer side {size}: full decode + resize {full:.0f}, ours (draft) {ours:.0f}"
        f"  ratio {ours / full:.2f}"
      )
  if "conv2d_scipy_over_lax_conv" in results:
    print(
      f"conv2d write-up workload: scipy time / steady lax.conv time = "
      f"{results['conv2d_scipy_over_lax_conv']:.2f}"
    )
  if "cpu" in results:
    print("train step on CPU, examples/s: ours (CPU convolutions, micro-batch) vs XLA's convs")
    print(f"{'':18} {'batch':>5} {'devices':>7} {'micro':>5} {'XLA':>7} {'ours':>7} {'ratio':>6}")
    for name, rows in results["cpu"].items():
      for batch, r in rows.items():
        print(
          f"{name:18} {batch:>5} {r['devices']:7d} {r['micro_batch']:5d} "
          f"{r['xla_examples_per_sec']:7.1f} {r['examples_per_sec']:7.1f} {r['speedup']:6.2f}"
        )
  for axis, what in (("seeds", "seeds"), ("sweep", "points")):
    if axis not in results:
      continue
    print(
      f"{what} in one program: seconds per step, per {what[:-1]}-step, and per "
      f"{what[:-1]}-step ÷ one run's"
    )
    for name, rows in results[axis].items():
      for count, r in rows.items():
        print(
          f"  {name:18} {count:>7} {what:6} {r['sec_per_step']:8.4f} "
          f"{r['sec_per_seed_step']:8.4f} {r['per_seed_step_vs_one']:6.2f}"
        )
  if "forms" in results:
    print(
      "forms: the step with each variant's forms ÷ without them (median of per-round ratios; "
      f"malloc {results['malloc']})"
    )
    for path, r in results["forms"].items():
      speeds = ", ".join(f"{n} {v:.1f}" for n, v in r["examples_per_sec"].items())
      gains = ", ".join(f"{n} {v:.3f}" for n, v in r.get("gain", {}).items())
      same = ", ".join(r["same_program_as_default"]) or "-"
      print(f"  {path}\n    ex/s: {speeds}\n    gain: {gains}\n    not in this model: {same}")


if __name__ == "__main__":
  try:
    main()
  except KeyboardInterrupt:  # before the measurements or after them (main says which)
    exit_interrupted("\ninterrupted")
