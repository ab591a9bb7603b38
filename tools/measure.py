"""The measurements `./launch.sh report` makes (tools/report.py), each into one record.

A record says what was measured (part, name, config, the exact command), where and with
what (the device, the host, the package versions), when, and the numbers.
"""

import dataclasses
import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from research.errors import UserError
from tools import results

# Dense TFLOP/s per GPU from the vendors' datasheets (SXM parts). JAX runs float32 products on
# these GPUs' TF32 tensor cores by default, so TF32 is float32's peak.
GPU_PEAK_TFLOPS = {
  "H100 PCIe": {"bfloat16": 756.0, "float32": 378.0},
  "H100": {"bfloat16": 989.4, "float32": 494.7},
  "H200": {"bfloat16": 989.4, "float32": 494.7},
  "A100": {"bfloat16": 312.0, "float32": 156.0},
}


@dataclasses.dataclass(frozen=True)
class SpeedrunPeer:
  """A PyTorch speedrun script the report runs beside ours (tools/peer_airbench.py): never
  part of this project, fetched apart into the checkout's root (git ignores it) from `url`,
  the file at a pinned revision of its repository; its record names the file that ran."""

  title: str  # what the tables call it
  script: str  # its file name, the default of the report's --PEER PATH
  repository: str  # on GitHub
  revision: str  # the commit whose file is pinned
  sha256: str  # of that file
  sleep_cycles: int = 0  # GPU cycles its __main__ sleeps before each run (torch.cuda._sleep)

  @property
  def url(self) -> str:
    return f"https://raw.githubusercontent.com/{self.repository}/{self.revision}/{self.script}"

  def identity(self, path: Path) -> dict:
    """What ran: the pinned source and revision where `path` is that file (its checksum),
    else the revision as unknown."""
    sha256 = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    pinned = sha256 == self.sha256
    return {
      "source": f"github.com/{self.repository}/blob/{self.revision}/{self.script}",
      "revision": self.revision if pinned else "unknown: not the pinned revision's file",
      "sha256": sha256,
    }


SPEEDRUN_PEERS = {
  "airbench": SpeedrunPeer(
    "airbench94_muon",
    "airbench94_muon.py",
    "KellerJordan/cifar10-airbench",
    "096d14d9aa92dcc837ab4f1f288dffea2bbe41b7",  # 2025-03-02, the file's last change
    "704e29251a5207d8aed8a35adf13f772ff386b90a712aaddc2a28854385b536e",
  ),
  "hiverge": SpeedrunPeer(
    "hiverge's cifar10_speedrun",
    "cifar10_speedrun.py",
    "hiverge/cifar10-speedrun",
    "5cd49b1e586f473b535cdeee69fe8ad5b6e9618b",  # 2025-09-30, the 2.015 s record
    "d1e1f6991cc3e1758c0bbc0e728c86a4b3119dd42a9233075b2edb9735d0ba91",
    sleep_cycles=6_000_000_000,
  ),
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
  peer: str = ""  # peer: the PyTorch network (tools/peer_torch.py), or a SPEEDRUN_PEERS name
  # (steps: the runs of each recipe, tools/peer_airbench.py)
  image_size: int = 32  # peer: input pixels per side
  rounds: int = 1  # throughput, peer: `steps` timed this many times; the median is recorded

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
  # In sys.path order: where a package is installed twice (wheels carried onto PYTHONPATH over a
  # site's own), the first found is the one that imports.
  for dist in importlib.metadata.distributions():
    name = dist.metadata["Name"].lower()
    if name in names or name.startswith(("jax-cuda", "nvidia-cudnn")):
      found.setdefault(name, dist.version)
  return dict(sorted(found.items()))


def device_info() -> dict:
  import jax

  return {
    "kind": jax.devices()[0].device_kind,
    "count": jax.device_count(),
    "platform": jax.default_backend(),
    "cpu_model": _cpu_model(),
    "host_cores": os.cpu_count(),
  }


def machine_of(device: dict) -> str:
  d = device
  return results.machine_slug(d["kind"], d["count"], d["cpu_model"], d["host_cores"], d["platform"])


def code_version() -> str:
  """The checkout's commit, `+changes` if tracked files differ from it ("" outside git)."""

  def git(*args):
    where = Path(__file__).parent
    done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=where, check=False)
    return done.stdout.strip() if done.returncode == 0 else None

  try:
    commit, changes = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
  except OSError:  # no git here
    return ""
  return f"{commit}{'+changes' if changes else ''}" if commit else ""


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
    "machine": machine_of(device),
    "device": device,
    "versions": _versions(extra.pop("versions_extra", ())),
    "code": code_version(),  # the commit measured
    "numbers": numbers,
    **extra,
  }


def train_command(m: Measurement, extra: dict) -> list[str]:
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


def model_flops(step, *args) -> float:
  """FLOPs of one call of the train step `step`, pmapped over all local devices, as XLA counts
  them in the step lowered with XLA's own ops (the CPU forms off, research/steps.py): a
  convolution's kernel taps on the image, not on its padding. XLA's CPU cost analysis counts
  them on any backend: the analysis of a compiled GPU step counts nothing for the library calls
  (cuDNN) in place of its convolutions, and JAX analyses a lowered step on built-in backends
  only, not on plugins such as CUDA's."""
  import jax
  from jax._src.lib import _jax  # what Lowered.cost_analysis calls where it can

  from research import cpu_forms
  from research import steps as steps_lib

  try:
    cpu = jax.devices("cpu")[0].client
  except RuntimeError:
    raise UserError(
      "counting a step's FLOPs needs JAX's CPU backend: unset JAX_PLATFORMS or add cpu to it"
    ) from None
  # A function of its own: JAX caches a function's traces, and `step`'s must stay the forms'.
  counted = jax.pmap(lambda *a: step(*a), axis_name=steps_lib.AXIS)
  with cpu_forms.without_cpu_forms():
    hlo = counted.lower(*args).compiler_ir("hlo").as_hlo_module()
  cost = _jax.hlo_module_cost_analysis(cpu, hlo)
  return float(cost.get("flops", 0.0)) * jax.local_device_count()


def step_speed(config, steps: int, rounds: int = 1) -> dict:
  """Examples/s of the config's pmapped train step on device-resident data (the median of
  `rounds` timings of `steps` steps, each kept where there are several), and its FLOPs."""

  from research import train
  from research.placement import replicate
  from research.setup import setup

  config.update(
    dataset="synthetic",
    synthetic_train_size=2 * config.batch_size,
    synthetic_test_size=config.eval_batch_size,
    checkpoint_every_steps=0,
    checkpoint_every_epochs=0.0,
    eval_every_steps=0,
    eval_every_epochs=0.0,
  )
  training = setup(config)
  batches = training.inputs.batches(0)
  first = next(batches)
  rstate = replicate(training.state)
  flops = model_flops(training.train_step, rstate, first)
  step, _ = train.compile_step(training, rstate, first)  # the program a run of it trains with
  speeds = []
  for i in range(rounds):
    # Five warm-up steps: on CPU the first few grow the host heap (research/host_memory.py).
    seconds, rstate = time_steps(step, rstate, batches, steps, warmup=5 * (i == 0))
    speeds.append(steps * config.batch_size / seconds)
  return {
    "batch_size": config.batch_size,
    "examples_per_sec": statistics.median(speeds),
    **({"examples_per_sec_rounds": speeds} if rounds > 1 else {}),
    "flops_per_step": flops,
    "micro_batch": training.micro_batch,
  }


def throughput(m: Measurement, device: dict, budget_end: float = float("inf")) -> list[dict]:
  """Records at the config's global batch and, with `search_batch`, the largest that fits
  (doubling until the device runs out of memory, at most `search_up_to` × the default). A
  doubling that would not end before `budget_end` is not started: the search records the
  largest batch it timed, and says so (the record's `search_end`: tools/results.SEARCH_ENDS)."""
  import jax

  default = m.config_dict().batch_size
  found, batch, end = [], default, "limit"
  while True:
    config = m.config_dict()
    config.batch_size = batch
    started = time.time()
    try:
      found.append(step_speed(config, m.steps, m.rounds))
    except Exception as e:
      if not _is_oom(e):
        raise
      if not found:
        raise UserError(
          f"throughput {m.name}: the config's global batch {batch} does not fit in device "
          "memory here"
        ) from None
      print(f"  global batch {batch}: out of device memory", flush=True)
      end = "memory"
      break
    finally:
      jax.clear_caches()
    print(f"  global batch {batch}: {found[-1]['examples_per_sec']:,.1f} examples/s", flush=True)
    if not m.search_batch or batch * 2 > m.search_up_to * default:
      break
    # The next batch costs about twice this one: its compile grows, its timed steps double
    now = time.time()
    if now + 2 * (now - started) > budget_end:
      print(
        f"  global batch {batch * 2}: not started, it would end after the budget (the report "
        "skips what it recorded: --again with a larger --budget searches further)",
        flush=True,
      )
      end = "budget"
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
    ended = {"search_end": end} if name != m.name else {}
    records.append(
      _record(measured, device, command, numbers, search_batch=m.search_batch, **ended)
    )
  return records


def peer_speed(m: Measurement) -> dict:
  """The PyTorch peer's examples/s, in a process of its own (PyTorch never imports here)."""
  model = m.config_dict().model
  command = [sys.executable, "-m", "tools.peer_torch", "--model", m.peer]
  command += ["--batch", str(m.config_dict().batch_size), "--dtype", m.dtype]
  command += ["--steps", str(m.steps), "--rounds", str(m.rounds), "--image-size", str(m.image_size)]
  command += ["--num-classes", str(model.num_classes)]
  if m.peer == "vgg":
    command += ["--depth", str(model.depth), "--width", str(model.width)]
  result = subprocess.run(command, capture_output=True, text=True)
  if result.returncode:
    raise UserError(f"the PyTorch peer failed: {result.stderr.strip()[-400:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def peer(m: Measurement, device: dict, theirs: dict) -> list[dict]:
  """Our step at the peer's batch and dtype, against the PyTorch step measured before."""
  ours = step_speed(m.config_dict(), m.steps, m.rounds)
  numbers = {
    "batch_size": ours["batch_size"],
    "examples_per_sec": ours["examples_per_sec"],
    **({"examples_per_sec_rounds": ours["examples_per_sec_rounds"]} if m.rounds > 1 else {}),
    "peer_examples_per_sec": theirs["examples_per_sec"],
    "ratio": ours["examples_per_sec"] / theirs["examples_per_sec"],
    "peer": theirs,
  }
  command = f"./launch.sh report --only peer:{m.name}"
  return [_record(m, device, command, numbers, versions_extra=("torch", "torchvision"))]


# {(peer, its file's sha256, the data, runs): its result}: each peer runs once a process, for
# both of our recipes (its compile and warm-up take minutes of a GPU lease)
_THEIRS: dict = {}


def speedrun_peer(
  m: Measurement, device: dict, workdir: Path, budget_end: float, data: Path, script: Path
):
  """The speedrun against a PyTorch speedrun script (SPEEDRUN_PEERS[m.peer], run by
  tools/peer_airbench.py) on the same GPU and the same pixels: its `m.steps` runs, then as
  many of ours (seeds 0, 1, ...), in one invocation (theirs are kept if the budget stops ours,
  which the next invocation trains again). Both are timed over the script's own span: the
  whitening init, training and the TTA eval (ours: its `init_from_data_sec`, `train_sec` and
  final `eval_sec`, compiles apart; each part is recorded too)."""
  peer = SPEEDRUN_PEERS[m.peer]
  from research.data import folder

  theirs_path = workdir / f"{m.peer}.json"  # a finished part is kept when the budget stops ours
  ran = _THEIRS.get((m.peer, peer.identity(script)["sha256"], str(data), m.steps))
  if ran and not theirs_path.exists():  # this process ran it for another recipe: not again
    workdir.mkdir(parents=True, exist_ok=True)
    theirs_path.write_text(ran)
  if not theirs_path.exists():
    dataset = folder.load_resident(folder.scan(str(data)), skip_bad=False, size=32)  # CIFAR
    workdir.mkdir(parents=True, exist_ok=True)
    pixels = workdir / "pixels.npz"
    np.savez(
      pixels,
      train_images=dataset.train_images,
      train_labels=dataset.train_labels,
      test_images=dataset.test_images,
      test_labels=dataset.test_labels,
      num_classes=dataset.num_classes,
    )
    command = [sys.executable, "-m", "tools.peer_airbench", f"--script={script}"]
    command += [f"--pixels={pixels}", f"--runs={m.steps}", f"--workdir={workdir / m.peer}"]
    command += [f"--sleep_cycles={peer.sleep_cycles}"]
    log_path = workdir / f"{m.peer}.log"
    with open(log_path, "w") as log:
      code = run_child(command, timeout=max(1.0, budget_end - time.time()), stdout=log)
    if code != 0:
      print(f"peer {m.name}: {peer.title} did not finish (exit {code}): {log_path}")
      return []
    theirs = json.loads(log_path.read_text().strip().splitlines()[-1])
    theirs["script"] = peer.identity(script)  # the file that ran
    if theirs["script"]["revision"] != peer.revision:
      print(f"peer {m.name}: {script} is not the file at {peer.url}: its record says so")
    theirs_path.write_text(json.dumps(theirs))
    _THEIRS[m.peer, theirs["script"]["sha256"], str(data), m.steps] = theirs_path.read_text()
  theirs = json.loads(theirs_path.read_text())
  ours = []
  for seed in range(m.steps):
    run = workdir / f"ours-seed{seed}"
    if "train_sec" not in (_metrics(run) or [{}])[-1]:
      shutil.rmtree(run, ignore_errors=True)  # one launch from step 0: its time is the run's
      args = train_command(m, {"dataset": "folder", "data_dir": str(data), "seed": seed})
      if not _train(args, run, budget_end):
        print(f"peer {m.name}: stopped at the budget; run the report again to continue")
        return []
    ours.append(_metrics(run)[-1])
  numbers = {
    "runs": m.steps,
    "peer_title": peer.title,
    "whitening_sec": [r["init_from_data_sec"] for r in ours],
    "train_sec": [r["train_sec"] for r in ours],
    "eval_sec": [r["eval_sec"] for r in ours],  # the final eval, with its views (TTA)
    # the peer's span: the whitening init, training and the TTA eval (compiles apart)
    "span_sec": [r["init_from_data_sec"] + r["train_sec"] + r["eval_sec"] for r in ours],
    "compile_sec": [r["compile_sec"] + r["eval_compile_sec"] for r in ours],
    "test_accuracy": [r["eval_accuracy"] for r in ours],
    "test_accuracy_first_view": [r["eval_accuracy_first_view"] for r in ours],
    "peer_time_sec": [r["time_sec"] for r in theirs["runs"]],
    # its parts as its output gives them: each epoch's row (time so far, the whitening in the
    # first) and the TTA eval; absent from records made before the script's rows were kept
    "peer_eval_sec": [r.get("eval_sec") for r in theirs["runs"]],
    "peer_epochs": [r.get("epochs") for r in theirs["runs"]],
    "peer_test_accuracy": [r["tta_accuracy"] for r in theirs["runs"]],
    "peer_test_accuracy_first_view": [r["accuracy"] for r in theirs["runs"]],
    "peer_warmup_sec": theirs["warmup_sec"],
    "peer_script": theirs.get("script"),  # its source, revision and checksum
  }
  numbers["ratio"] = statistics.mean(numbers["span_sec"]) / statistics.mean(
    numbers["peer_time_sec"]
  )
  train_examples = len(folder.scan(str(data)).train.paths)
  dataset = f"{data.name} ({train_examples:,} train, {ours[0]['eval_examples']:,} test)"
  return [
    _record(
      m, device, speedrun_peer_command(m), numbers, dataset=dataset, versions_extra=("torch",)
    )
  ]


def speedrun_peer_command(m: Measurement) -> str:
  script = SPEEDRUN_PEERS[m.peer].script
  return f"./launch.sh report --only peer:{m.name} --{m.peer} {script} --data DIR"


def _metrics(workdir: Path) -> list[dict]:
  path = workdir / "metrics.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class Stopped(Exception):
  """This process was sent SIGTERM while a child ran; the child stopped first (checkpointed)."""


def run_child(command: list[str], timeout: float | None = None, **popen) -> int | None:
  """Runs `command` to its end and returns its exit code, or None if `timeout` seconds passed
  first (the child is then sent SIGTERM, and checkpoints and stops). A SIGTERM to this process
  is passed on to the child, waited for, and raised as Stopped; on Ctrl-C (which a terminal
  sends the child too) this process waits for the child before it stops."""
  process = subprocess.Popen(command, **popen)

  def stop(signum, frame):
    raise Stopped

  previous = signal.signal(signal.SIGTERM, stop)
  try:
    try:
      return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      process.send_signal(signal.SIGTERM)
      process.wait()
      return None
    except Stopped:
      process.send_signal(signal.SIGTERM)
      process.wait()
      raise
    except KeyboardInterrupt:
      process.wait()  # a second Ctrl-C aborts both
      raise
  finally:
    signal.signal(signal.SIGTERM, previous)
    if process.poll() is None:
      process.kill()


def _train(args: list[str], workdir: Path, budget_end: float) -> bool:
  """Runs `./launch.sh ARGS --workdir=WORKDIR` as a child, stopped at the budget's end (it
  checkpoints). True if it ran to the end: a run preempted by anyone exits 0 as well, so its
  log must end with the final eval, the one record that carries `train_sec`. A run that fails
  or is killed is a UserError: a rerun would most likely end the same way."""
  command = [sys.executable, "-m", "research.main", f"--config={args[0]}", *args[1:]]
  code = run_child([*command, f"--workdir={workdir}"], timeout=max(1.0, budget_end - time.time()))
  if code not in (0, None):
    how = f"was killed by signal {-code}" if code < 0 else f"failed (exit code {code})"
    raise UserError(
      f"the training run {how}; what it printed is above: "
      f"./launch.sh {shlex.join(args)} --workdir={workdir}"
    )
  return code == 0 and "train_sec" in (_metrics(workdir) or [{}])[-1]


def _jpeg_folder(root: Path, classes: int, per_class: int) -> Path:
  """An image folder of generated 500×375 JPEGs: `per_class` train and 4 val images a class."""

  done = root / f".complete-{classes}x{per_class}"
  if not done.exists():
    for k in range(classes):
      imagenet_sized_jpegs(root / "train" / f"c{k:02d}", per_class, k * per_class)
      imagenet_sized_jpegs(root / "val" / f"c{k:02d}", 4, 10**6 + 4 * k)
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
  args = train_command(m, extra)
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

  args = train_command(m, {"dataset": "folder", "data_dir": "DIR"})
  if "train_sec" in (_metrics(workdir) or [{}])[-1]:  # a finished run that has no record
    shutil.rmtree(workdir)  # is not measured again by its final eval alone: trained anew
  if not _train([a.replace("=DIR", f"={data}") for a in args], workdir, budget_end):
    print(f"main {m.name}: stopped at the budget; run the report again to continue", flush=True)
    return []
  metrics = _metrics(workdir)
  curve, wall = results.launch_curve(metrics)
  log_every = m.config_dict().log_every_steps
  intervals = [r for r in metrics if "loss" in r and r["step"] % log_every == 0]
  final = [r for r in metrics if "eval_accuracy" in r][-1]
  scanned = folder.scan(str(data))
  per_seed = final.get("per_seed", {})  # a run of several seeds: each seed's accuracy
  numbers = {
    "test_accuracy": per_seed.get("eval_accuracy", final["eval_accuracy"]),
    "eval_examples": final["eval_examples"],
    "steps": final["step"],
    "wall_time_sec": wall,
    "examples_per_sec": statistics.median(r["examples_per_sec"] for r in intervals),
  }
  if "eval_accuracy_first_view" in final:  # test-time augmentation: the plain accuracy too
    first_view = per_seed.get("eval_accuracy_first_view", final["eval_accuracy_first_view"])
    numbers["test_accuracy_first_view"] = first_view
  if per_seed:
    numbers["seeds"] = per_seed["seed"]
  launches = (workdir / "metadata.jsonl").read_text().count('"jax_version"')
  if launches == 1 and "train_sec" in final:  # one launch: its parts' times, compiles apart
    numbers["train_sec"] = final["train_sec"]
    numbers["eval_sec"] = final["eval_sec"]  # the final eval (with its views, if any)
    if "init_from_data_sec" in final:  # parameters from data: the speedrun's whitening
      numbers["whitening_sec"] = final["init_from_data_sec"]
  dataset = f"{data.name} ({len(scanned.train.paths):,} train, {final['eval_examples']:,} test)"
  command = "./launch.sh " + shlex.join(args)
  return [_record(m, device, command, numbers, dataset=dataset, curve=curve)]


def time_steps(p_step, rstate, batches, steps: int, warmup: int = 3):
  """(seconds of `steps` back-to-back steps after `warmup` steps, the state after them);
  blocks once at the end. The state passed in is donated: use the one returned."""
  import jax

  for _ in range(warmup):
    rstate, metrics = p_step(rstate, next(batches))
  jax.block_until_ready(rstate)
  start = time.perf_counter()
  for _ in range(steps):
    rstate, metrics = p_step(rstate, next(batches))
  jax.block_until_ready(metrics)
  return time.perf_counter() - start, rstate


def imagenet_sized_jpegs(directory: Path, count: int, first_seed: int = 0) -> list[Path]:
  """`count` photo-like 500×375 JPEGs at quality 90 (ImageNet's typical size; ~75 kB each)."""
  from PIL import Image

  directory.mkdir(parents=True, exist_ok=True)
  paths = []
  for i in range(count):
    rng = np.random.default_rng(first_seed + i)
    coarse = Image.fromarray(rng.integers(0, 256, (24, 32, 3), np.uint8))
    smooth = np.asarray(coarse.resize((500, 375), Image.BICUBIC), np.float32)
    texture = np.clip(smooth + rng.normal(0, 10, smooth.shape), 0, 255).astype(np.uint8)
    paths.append(directory / f"{i:04d}.jpg")
    Image.fromarray(texture).save(paths[-1], quality=90)
  return paths
