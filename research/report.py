"""Measures the README's results on the accelerator at hand and records each number.

  ./launch.sh report                        # every part; each resumes where it stopped
  ./launch.sh report --only main            # one part (or one measurement: --only main:NAME)
  ./launch.sh report --data DIR             # CIFAR-10 as an image folder, or a .tar.gz of one
  ./launch.sh report --render               # only re-render the tables and the plot

Parts, at GPU sizes (a CPU host runs the same parts at CPU sizes, so the report is tested):
  throughput  each training config's step, float32 and bfloat16, at its default global batch
              and at the largest that fits: examples/s, and FLOPs per step (XLA's cost analysis
              of the compiled step) over the device's peak (MFU).
  peer        the same networks' training steps in PyTorch on the same device, when torch
              imports (research/peer_torch.py): our examples/s ÷ theirs.
  streamed    Inception-v3 in bfloat16 on generated ImageNet-sized JPEGs, streamed through as
              many decode workers as the host has cores: examples/s, input wait, and one
              worker's decode rate.
  main        the recipes trained to completion on real CIFAR-10: test accuracy, wall time,
              examples/s and the eval curve.
Each measurement writes one JSON record, results/<machine>/<part>-<name>.json; one already
recorded is skipped (`--again` redoes it). A part stops starting measurements once `--budget`
seconds have passed, and a training run is stopped (SIGTERM: it checkpoints) at the budget and
resumed by the next invocation, so every invocation fits a 10-minute slot.
"""

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from research import environment, host_memory, results
from research.errors import EXIT_USER_ERROR, UserError

ROOT = Path(__file__).parent.parent
PARTS = ("throughput", "peer", "streamed", "main")
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"
# Dense TFLOP/s per GPU from the vendors' datasheets (SXM parts). JAX runs float32 products on
# these GPUs' TF32 tensor cores by default, so TF32 is float32's peak.
GPU_PEAK_TFLOPS = {
  "H100 PCIe": {"bfloat16": 756.0, "float32": 378.0},
  "H100": {"bfloat16": 989.4, "float32": 494.7},
  "H200": {"bfloat16": 989.4, "float32": 494.7},
  "A100": {"bfloat16": 312.0, "float32": 156.0},
}


@dataclasses.dataclass(frozen=True)
class Measurement:
  part: str
  name: str  # unique within its part: the record's file name
  label: str  # what the tables call it
  config: str  # configs/NAME.py[:variant]
  overrides: tuple = ()  # ("field", value) pairs, as --config.field=value
  steps: int = 0  # timed steps (throughput, peer) or steps to train (streamed)
  search_batch: bool = False  # throughput: also the largest global batch that fits ...
  search_up_to: int = 16  # ... trying up to this many times the config's batch
  peer: str = ""  # peer: the PyTorch network (research/peer_torch.py)
  image_size: int = 32  # peer: input pixels per side

  def config_dict(self):
    from research import configuration

    config = configuration.load(self.config)
    for field, value in self.overrides:
      *parents, leaf = field.split(".")
      node = config
      for name in parents:
        node = node[name]
      node[leaf] = value
    return config

  @property
  def dtype(self) -> str:
    return dict(self.overrides).get("model.dtype", "float32")


def _dtypes(part, stem, label, config, **kwargs) -> list[Measurement]:
  return [
    Measurement(part, f"{stem}-{dtype}", label, config, (("model.dtype", dtype),), **kwargs)
    for dtype in ("float32", "bfloat16")
  ]


def plan(scale: str, cores: int) -> list[Measurement]:
  """What the report measures at `scale`: "gpu", "cpu" (small sizes) or "tiny" (the tests)."""
  vgg, keras, inception = (
    "configs/cifar_vgg.py",
    "configs/cifar_keras_cnn.py",
    "configs/inception_v3.py",
  )
  m = []
  if scale == "gpu":
    m += _dtypes("throughput", "cifar_vgg", "VGG-16", vgg, steps=50, search_batch=True)
    m += _dtypes("throughput", "cifar_keras_cnn", "Keras CNN", keras, steps=50, search_batch=True)
    m += _dtypes(
      "throughput", "inception_v3", "Inception-v3 299²", f"{inception}:synthetic", steps=30
    )
    m += _dtypes("peer", "vgg16_bn", "VGG-16-BN", vgg, steps=50, peer="vgg")
    m += _dtypes("peer", "keras_cnn", "Keras CNN", keras, steps=50, peer="keras_cnn")
    m += _dtypes(
      "peer", "inception_v3", "Inception-v3 299²", f"{inception}:synthetic", steps=30,
      peer="inception_v3", image_size=299,
    )  # fmt: skip
    streamed = (("model.dtype", "bfloat16"), ("data_workers", cores), ("model.num_classes", 10))
    m.append(Measurement("streamed", "inception_v3", "Inception-v3", inception, streamed, steps=60))
    m += _dtypes("main", "cifar_vgg", "VGG-16 (200 epochs)", vgg)
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
    keras_main = (("num_epochs", 10), ("eval_every_steps", 195))  # an eval every epoch
    m.append(
      Measurement("main", "cifar_keras_cnn-10ep", "Keras CNN (10 epochs)", keras, keras_main)
    )
  elif scale == "tiny":
    smoke = "configs/cifar_vgg.py:smoke"
    m += _dtypes(
      "throughput", "vgg_smoke", "VGG :smoke", smoke, steps=2, search_batch=True, search_up_to=2
    )
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


# --- what every record says about where and with what it was measured ---------------------


def _cpu_model() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "CPU"


def _versions(extra=()) -> dict:
  names = ["jax", "jaxlib", "flax", "optax", "numpy", "orbax-checkpoint", *extra]
  found = {"python": platform.python_version()}
  for dist in importlib.metadata.distributions():
    name = dist.metadata["Name"].lower()
    if name in names or name.startswith(("jax-cuda", "nvidia-cudnn")):
      found[name] = dist.version
  return dict(sorted(found.items()))


def _device() -> dict:
  import jax

  return {
    "kind": jax.devices()[0].device_kind,
    "count": jax.device_count(),
    "platform": jax.default_backend(),
    "cpu_model": _cpu_model(),
    "host_cores": os.cpu_count(),
  }


def _machine(device: dict) -> str:
  d = device
  return results.machine_slug(d["kind"], d["count"], d["cpu_model"], d["host_cores"], d["platform"])


def _record(m: Measurement, device: dict, command: str, numbers: dict, **extra) -> dict:
  return {
    "part": m.part,
    "name": m.name,
    "label": m.label,
    "dtype": m.dtype,
    "config": m.config,
    "overrides": dict(m.overrides),
    "command": command,
    "date": datetime.date.today().isoformat(),
    "machine": _machine(device),
    "device": device,
    "versions": _versions(extra.pop("versions_extra", ())),
    "numbers": numbers,
    **extra,
  }


def _train_command(m: Measurement, extra: dict) -> list[str]:
  """`./launch.sh CONFIG --config.FIELD=VALUE ...` for `m`, with `extra` fields set too."""
  fields = {**dict(m.overrides), **extra}
  return [m.config, *(f"--config.{k}={v}" for k, v in fields.items())]


# --- the measurements ------------------------------------------------------------------------


def _is_oom(e: Exception) -> bool:
  return "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()


_MEASURED_PEAKS: dict = {}


def _matmul_ceiling(dtype: str) -> float:
  """TFLOP/s of this host's best 2048² matrix product in `dtype` (best of 5 after a warm-up)."""
  if dtype not in _MEASURED_PEAKS:
    import jax
    import jax.numpy as jnp

    x = jax.random.normal(jax.random.key(0), (2048, 2048), jnp.dtype(dtype))
    matmul = jax.jit(lambda a: a @ a)
    matmul(x).block_until_ready()
    best = float("inf")
    for _ in range(5):
      start = time.perf_counter()
      matmul(x).block_until_ready()
      best = min(best, time.perf_counter() - start)
    _MEASURED_PEAKS[dtype] = 2 * 2048**3 / best / 1e12
  return _MEASURED_PEAKS[dtype]


def peak_tflops(device: dict, dtype: str) -> tuple[float, str]:
  """The device's peak TFLOP/s for `dtype` (all its devices together) and where it comes from."""
  if device["platform"] == "gpu":
    for name, peaks in GPU_PEAK_TFLOPS.items():  # the most specific name first
      if name in device["kind"]:
        what = "TF32 tensor cores" if dtype == "float32" else "tensor cores"
        return peaks[dtype] * device["count"], f"datasheet, dense, {what}"
    return 0.0, f"no datasheet peak known for {device['kind']}"
  return _matmul_ceiling(dtype), f"measured: 2048² {dtype} matrix product on this host"


def step_speed(config, steps: int) -> dict:
  """Examples/s of the config's pmapped train step on device-resident data, and its FLOPs."""
  import jax

  from research import benchmark, train
  from research.placement import replicate
  from research.steps import AXIS

  config.update(
    dataset="synthetic",
    synthetic_train_size=2 * config.batch_size,
    synthetic_test_size=config.eval_batch_size,
    checkpoint_every_steps=0,
    eval_every_steps=0,
  )
  run = train.setup(config)
  batches = run.inputs.batches(0)
  first = next(batches)
  rstate = replicate(run.state)
  p_step = jax.pmap(run.inputs.train_step, axis_name=AXIS, donate_argnums=(0,))
  compiled = p_step.lower(rstate, first).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  seconds = benchmark.time_steps(compiled, rstate, batches, steps)
  return {
    "batch_size": config.batch_size,
    "examples_per_sec": steps * config.batch_size / seconds,
    "flops_per_step": float(cost.get("flops", 0.0)) * jax.local_device_count(),  # per device
    "micro_batch": run.micro_batch,
  }


def throughput(m: Measurement, device: dict) -> list[dict]:
  """Records at the config's global batch and, with `search_batch`, the largest that fits
  (doubling until the device runs out of memory, at most `search_up_to` × the default)."""
  import jax

  default = m.config_dict().batch_size
  found, batch = [], default
  while True:
    config = m.config_dict()
    config.batch_size = batch
    try:
      found.append(step_speed(config, m.steps))
    except Exception as e:
      if not (_is_oom(e) and found):
        raise
      print(f"  global batch {batch}: out of device memory", flush=True)
      break
    finally:
      jax.clear_caches()
    print(f"  global batch {batch}: {found[-1]['examples_per_sec']:,.1f} examples/s", flush=True)
    if not m.search_batch or batch * 2 > m.search_up_to * default:
      break
    batch *= 2
  peak, source = peak_tflops(device, m.dtype)
  command = f"./launch.sh report --only throughput:{m.name}"
  records = []
  for numbers, name in ((found[0], m.name), (found[-1], f"{m.name}-largest")):
    if name != m.name and len(found) == 1:
      break
    seconds = numbers["batch_size"] / numbers["examples_per_sec"]
    numbers = {
      **numbers,
      "peak_tflops": peak,
      "peak_source": source,
      "mfu": numbers["flops_per_step"] / seconds / (peak * 1e12) if peak else None,
    }
    measured = dataclasses.replace(m, name=name)
    records.append(_record(measured, device, command, numbers, search_batch=m.search_batch))
  return records


def peer_speed(m: Measurement) -> dict:
  """The PyTorch peer's examples/s, in a process of its own (no JAX there to hold the GPU)."""
  model = m.config_dict().model
  command = [sys.executable, "-m", "research.peer_torch", "--model", m.peer]
  command += ["--batch", str(m.config_dict().batch_size), "--dtype", m.dtype]
  command += ["--steps", str(m.steps), "--image-size", str(m.image_size)]
  command += ["--num-classes", str(model.num_classes)]
  if m.peer == "vgg":
    command += ["--depth", str(model.depth), "--width", str(model.width)]
  result = subprocess.run(command, capture_output=True, text=True)
  if result.returncode:
    raise UserError(f"the PyTorch peer failed: {result.stderr.strip()[-400:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def peer(m: Measurement, device: dict, theirs: dict) -> list[dict]:
  """Our step at the peer's batch and dtype, against the PyTorch step measured before."""
  ours = step_speed(m.config_dict(), m.steps)
  numbers = {
    "batch_size": ours["batch_size"],
    "examples_per_sec": ours["examples_per_sec"],
    "peer_examples_per_sec": theirs["examples_per_sec"],
    "ratio": ours["examples_per_sec"] / theirs["examples_per_sec"],
    "peer": theirs,
  }
  command = f"./launch.sh report --only peer:{m.name}"
  return [_record(m, device, command, numbers, versions_extra=("torch", "torchvision"))]


def _metrics(workdir: Path) -> list[dict]:
  path = workdir / "metrics.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _train(args: list[str], workdir: Path, budget_end: float) -> bool:
  """Runs `./launch.sh ARGS --workdir=WORKDIR` as a child; at the budget's end it is sent
  SIGTERM (it checkpoints and stops). True if it ran to the end."""
  command = [sys.executable, "-m", "research.main", f"--config={args[0]}", *args[1:]]
  process = subprocess.Popen([*command, f"--workdir={workdir}"])
  try:
    return process.wait(timeout=max(1.0, budget_end - time.time())) == 0
  except subprocess.TimeoutExpired:
    process.send_signal(signal.SIGTERM)
    process.wait()
    return False
  finally:
    if process.poll() is None:
      process.kill()


def _jpeg_folder(root: Path, classes: int, per_class: int) -> Path:
  """An image folder of generated 500×375 JPEGs: `per_class` train and 4 val images a class."""
  from research import benchmark

  done = root / f".complete-{classes}x{per_class}"
  if not done.exists():
    for k in range(classes):
      benchmark.imagenet_sized_jpegs(root / "train" / f"c{k:02d}", per_class, k * per_class)
      benchmark.imagenet_sized_jpegs(root / "val" / f"c{k:02d}", 4, 10**6 + 4 * k)
    done.touch()
  return root


def decode_rate(paths: list[Path], size: int) -> float:
  """Images/s of one process decoding `paths` to host size, as each decode worker does."""
  from research.data import folder

  start = time.perf_counter()
  for path in paths:
    folder.read_rgb(str(path), size)
  return len(paths) / (time.perf_counter() - start)


STREAMED_IMAGES = {"gpu": (10, 256), "cpu": (10, 32), "tiny": (2, 16)}  # (classes, per class)


def streamed(m: Measurement, device: dict, workdir: Path, budget_end: float, scale: str):
  """Trains `m.steps` steps on a streamed folder of generated ImageNet-sized JPEGs."""
  import shutil

  classes, per_class = STREAMED_IMAGES[scale]
  jpegs = _jpeg_folder(workdir.parent / "jpegs", classes, per_class)
  shutil.rmtree(workdir, ignore_errors=True)  # a short run: measured afresh each time
  extra = {
    "dataset": "folder",
    "data_dir": "DIR",
    "data_placement": "streamed",
    "model.num_classes": classes,
    "num_train_steps": m.steps,
    "eval_every_steps": 0,
  }
  args = _train_command(m, extra)
  if not _train([a.replace("=DIR", f"={jpegs}") for a in args], workdir, budget_end):
    return []
  train_records = [r for r in _metrics(workdir) if "loss" in r][2:]  # not step 1, not warm-up
  config = m.config_dict()
  paths = sorted((jpegs / "train").rglob("*.jpg"))[:200]
  numbers = {
    "batch_size": config.batch_size,
    "data_workers": config.data_workers,
    "examples_per_sec": statistics.median(r["examples_per_sec"] for r in train_records),
    "input_wait_fraction": statistics.median(r["input_wait_fraction"] for r in train_records),
    "decode_images_per_sec_per_worker": decode_rate(paths, config.host_image_size),
    "images": f"{classes * per_class} generated 500×375 JPEGs, quality 90",
  }
  return [_record(m, device, "./launch.sh " + shlex.join(args), numbers)]


def main_run(m: Measurement, device: dict, workdir: Path, budget_end: float, data: Path):
  """Trains the recipe to completion on the real data (resuming a run the budget stopped)."""
  from research.data import folder

  args = _train_command(m, {"dataset": "folder", "data_dir": "DIR"})
  if not _train([a.replace("=DIR", f"={data}") for a in args], workdir, budget_end):
    print(f"main {m.name}: stopped at the budget; run the report again to continue", flush=True)
    return []
  metrics = _metrics(workdir)
  curve, wall = results.launch_curve(metrics)
  log_every = m.config_dict().log_every_steps
  intervals = [r for r in metrics if "loss" in r and r["step"] % log_every == 0]
  final = [r for r in metrics if "eval_accuracy" in r][-1]
  scanned = folder.scan(str(data))
  numbers = {
    "test_accuracy": final["eval_accuracy"],
    "eval_examples": final["eval_examples"],
    "steps": final["step"],
    "wall_time_sec": wall,
    "examples_per_sec": statistics.median(r["examples_per_sec"] for r in intervals),
  }
  dataset = f"{data.name} ({len(scanned.train.paths):,} train, {final['eval_examples']:,} test)"
  command = "./launch.sh " + shlex.join(args)
  return [_record(m, device, command, numbers, dataset=dataset, curve=curve)]


# --- the command -----------------------------------------------------------------------------


def image_folder(data: str) -> Path | None:
  """The image folder `--data` names (a .tar.gz of one is extracted once to the data cache);
  without `--data`, the CIFAR-10 JPEG archive beside the checkout, if there is one."""
  from research.data import CACHE

  path = Path(data).expanduser() if data else DEFAULT_DATA
  if not path.exists():
    if data:
      raise UserError(f"--data={data} does not exist; give an image folder or a .tar.gz of one")
    return None
  if path.is_dir():
    return path
  if not path.name.endswith((".tar.gz", ".tgz", ".tar")):
    raise UserError(f"--data={data} is neither a directory nor a .tar.gz archive")
  target = CACHE / "report" / path.name.split(".")[0]
  if not (target / ".complete").exists():
    print(f"extracting {path} to {target} (once) ...", flush=True)
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path) as tar:
      tar.extractall(target, filter="data")
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
  if m.part != "main" or scale == "tiny":
    return f"~{ROUGH_MINUTES[scale][m.part]:g} min"
  stem = m.name.split("-")[0]
  measured = machine / f"throughput-{stem}-{m.dtype}.json"
  if not measured.exists():
    return "unknown until the throughput part has run here (it resumes across invocations)"
  config = m.config_dict()
  speed = json.loads(measured.read_text())["numbers"]["examples_per_sec"]
  steps = config.num_train_steps if config.num_train_steps > 0 else config.num_epochs * 195
  return f"~{steps * config.batch_size / speed / 60:.0f} min of training at {speed:,.0f} examples/s"


def _prepare(args):
  """(scale, device, the measurements chosen, those not recorded yet, the real data)."""
  import jax

  scale = args.scale or ("cpu" if jax.default_backend() == "cpu" else "gpu")
  device = _device()
  machine_dir = Path(args.results) / _machine(device)
  chosen = [
    m
    for m in plan(scale, os.cpu_count() or 1)
    if not args.only or args.only in (m.part, f"{m.part}:{m.name}")
  ]
  if not chosen:
    raise UserError(f"--only={args.only} names no measurement; parts: {', '.join(PARTS)}")
  data = image_folder(args.data) if any(m.part == "main" for m in chosen) else None
  recorded = lambda m: (machine_dir / f"{m.part}-{m.name}.json").exists()
  todo = [m for m in chosen if (args.again or not recorded(m))]
  todo = [m for m in todo if not (m.part == "main" and data is None)]
  print(f"report on {results.hardware({'device': device})} ({scale} sizes) into {machine_dir}")
  for m in chosen:
    state = "to measure" if m in todo else "recorded (--again redoes it)"
    if m.part == "main" and data is None:
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
      command = [sys.executable, "-m", "research.report", f"--only={part}", *forwarded]
      if code := subprocess.run(command, env=children).returncode:
        return code
    return 0
  if args.only.startswith("peer"):  # JAX takes device memory as it needs it: PyTorch runs first
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  scale, device, todo, data = _prepare(args)
  workdirs = Path(args.workdir) / _machine(device)
  for part in PARTS:
    pending = [m for m in todo if m.part == part]
    if not pending:
      continue
    budget_end = time.time() + args.budget
    theirs = {}
    if part == "peer":
      try:
        import torch  # noqa: F401
      except ImportError:
        print("peer: skipped, torch does not import here", flush=True)
        continue
      theirs = {m.name: peer_speed(m) for m in pending}
    for i, m in enumerate(pending):
      if i and time.time() > budget_end:
        print(f"{part}: budget spent; run the report again for the rest", flush=True)
        break
      print(f"{part} {m.name}: {m.label}, {m.dtype} ...", flush=True)
      workdir = workdirs / f"{part}-{m.name}"
      if part == "throughput":
        records = throughput(m, device)
      elif part == "peer":
        records = peer(m, device, theirs[m.name])
      elif part == "streamed":
        records = streamed(m, device, workdir, budget_end, scale)
      else:
        records = main_run(m, device, workdir, budget_end, data)
      for record in records:
        print(f"  wrote {results.write(record, args.results)}", flush=True)
  if Path(args.results).resolve() == results.RESULTS.resolve():
    render()
  return 0


def render() -> None:
  """Rewrites the README's and BENCHMARKS.md's tables and the plot from results/."""
  records = results.load()
  for path, text in results.rendered(records, expected_rows()).items():
    path.write_text(text)
  results.plot(records)
  print(f"rendered the tables in README.md and BENCHMARKS.md, and {results.PLOT}")


def expected_rows() -> list[dict]:
  """The table's rows for the recipes each kind of machine trains, measured or not yet."""
  rows = []
  for scale, hardware in (("gpu", "a GPU"), ("cpu", "a CPU host")):
    for m in plan(scale, 1):
      if m.part == "main":
        args = _train_command(m, {"dataset": "folder", "data_dir": "DIR"})
        rows.append(
          {
            "name": m.name,
            "label": m.label,
            "dataset": "CIFAR-10 (JPEG folder)",
            "platform": scale,
            "hardware": hardware,
            "command": "./launch.sh " + shlex.join(args),
          }
        )
  return rows


def main() -> int:
  host_memory.keep_freed_memory()  # before JAX starts its threads
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--only", default="", help="a part, or PART:NAME for one measurement")
  parser.add_argument("--data", default="", help="CIFAR-10 as an image folder or its .tar.gz")
  parser.add_argument("--budget", type=float, default=540.0, help="seconds per part")
  parser.add_argument("--again", action="store_true", help="redo recorded measurements")
  parser.add_argument("--render", action="store_true", help="only re-render tables and plot")
  parser.add_argument("--scale", choices=("gpu", "cpu", "tiny"), help="default: the backend's")
  parser.add_argument("--results", default=str(results.RESULTS), help=argparse.SUPPRESS)
  parser.add_argument("--workdir", default="runs/report", help="where the runs train")
  args = parser.parse_args()
  try:
    environment.check({**environment.CORE, **environment.PLOTS})
    if args.render:
      render()
      return 0
    return run(args)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USER_ERROR


if __name__ == "__main__":
  sys.exit(main())
