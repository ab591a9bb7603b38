"""The training loop: pmap the single-device step, feed it, log, evaluate, checkpoint.

research/setup.py's `setup` builds what a run needs, each part once; `train_and_evaluate` pmaps
the step and runs the loop. Where the data lives and how a step takes its examples is
research/inputs.py; what one device does in a step is research/steps.py; what the loop records
is research/progress.py (Clock, Progress, Profiler), so that the loop itself stays a screen long.
The host here only dispatches steps and fetches metrics every `log_every_steps`.
"""

import contextlib
import dataclasses
import functools
import importlib.metadata
import itertools
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import flax
import jax
import ml_collections
import numpy as np
import tqdm
from jax import lax

from research import checkpoint, init_from, steps
from research import progress as progress_lib
from research import sweep as sweep_lib
from research import workdir as workdir_lib
from research.errors import UserError
from research.fields import for_module
from research.inputs import Inputs
from research.metrics import MetricsLog, check_step_metrics, eval_record
from research.placement import (
  first_replica,
  gather_processes,
  replicate,
  same_in_every_process,
  wait_for_all,
)
from research.preemption import Preempted, Preemption
from research.progress import Clock, Profiler, Progress, check_profile_end
from research.setup import Training, setup
from research.steps import AXIS


def _banner(text: str) -> str:
  line = "!" * 100
  return f"\n{line}\n{text}\n{line}\n"


def _write_metadata(workdir: Path, dataset_requested: str, training: Training) -> None:
  packages = {  # names normalised as pip writes them in requirements/*.lock
    re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version
    for d in importlib.metadata.distributions()
  }
  meta = {
    "time": time.time(),
    "jax_version": jax.__version__,
    "flax_version": flax.__version__,
    "backend": jax.default_backend(),
    "devices": [str(d) for d in jax.devices()],
    "device_count": jax.device_count(),
    "per_device_batch": training.per_device_batch,
    "micro_batch": training.micro_batch,  # examples per forward/backward pass
    "device_kind": jax.devices()[0].device_kind,
    "process_count": jax.process_count(),
    "dataset_requested": dataset_requested,
    "dataset_used": training.inputs.name,
    "dataset_source": training.inputs.source,
    "classes": list(training.inputs.classes),  # names in label order (research/trained.py)
    "example_shape": list(training.inputs.example_shape),  # [H, W, C] as stored: predict reads so
    "fallback_reason": training.inputs.fallback_reason,
    "skipped_images": len(training.inputs.skipped_files()),  # undecodable files skipped
    "passed_over_files": len(training.inputs.passed_over),  # image folders: non-images
    "packages": dict(sorted(packages.items())),  # installed versions
  }
  with open(workdir / workdir_lib.METADATA, "a") as f:  # one record per launch (resumes append)
    f.write(json.dumps(meta) + "\n")


def _describe(training: Training, state, echo) -> None:
  n = len(training.seeds)
  n_params = sum(x.size for x in jax.tree.leaves(state.params)) // n  # a point's
  per_device, micro = training.per_device_batch, training.micro_batch
  first, last = min(training.seeds), max(training.seeds)
  seeds = f" | seeds {first}-{last} in one program" if n > 1 else ""
  if "point" in training.columns:
    swept = " × ".join(f"{len(set(v))} {path}" for path, v in training.columns["swept"].items())
    seeds = f" | {n} points in one program: {swept}{f' × seeds {first}-{last}' * (last > first)}"
  echo(
    f"{training.model_name}: {n_params:,} parameters{' a point' if n > 1 else ''} | "
    f"{jax.device_count()} "
    f"device{'s' if jax.device_count() > 1 else ''} "
    f"({jax.devices()[0].device_kind}) | global batch {training.batch_size} = "
    f"{per_device} per device{f' in micro-batches of {micro}' if micro < per_device else ''} | "
    f"{training.inputs.steps_per_epoch} steps/epoch, {training.num_steps} "
    f"step{'s' if training.num_steps > 1 else ''}{seeds}"
    f" | data: {training.inputs.name} ({training.inputs.source}), "
    f"{training.inputs.layout}" + PER_DEVICE_STATISTICS * training.per_device_statistics
  )


PER_DEVICE_STATISTICS = (
  " | BatchNorm statistics per device (batch_norm_statistics='per_device'): results depend on "
  "the device count"
)


def _finite_or_stop(state, step: int, checkpoints, points: int = 0):
  """`state` if all its parameters are finite (a sweep's, `points` of them: one point's);
  otherwise stop before it is saved. A sweep's point that diverged stops alone (Progress)."""
  rows = lambda x: np.isfinite(x).reshape(points or 1, -1).all(1)
  finite = np.all([rows(x) for x in jax.tree.leaves(state.params)], 0)
  if not finite.any() or (not points and not finite.all()):
    raise UserError(
      f"parameters became NaN/inf by step {step}; {checkpoints.kept()}; lower learning_rate "
      "or set grad_clip_norm"
    )
  return state


def _data_identity(inputs: Inputs) -> dict:
  """What must not change when a run resumes: the same in every process."""
  data = {
    "dataset": inputs.name,
    "synthetic_fallback": bool(inputs.fallback_reason),
    "content": inputs.fingerprint,
  }
  if not same_in_every_process(data):
    raise UserError(
      f"the processes of this run read different data (process {jax.process_index()}: "
      f"{inputs.name} from {inputs.source}); give every host the same data_dir contents"
    )
  return data


def augmented_preview(gather, augment, step: int, batch) -> np.ndarray:
  """The first 32 examples of step `step`'s global batch (fewer if this process holds fewer),
  augmented as the step sees them: [32, h, w, C] (for TensorBoard and
  WORKDIR/augmented_batch.png)."""
  preview = functools.partial(steps.augmented_examples, gather=gather, augment=augment, count=32)
  images = jax.pmap(preview, axis_name=AXIS)(replicate(np.int32(step)), batch)
  shards = sorted(images.addressable_shards, key=lambda s: s.index[0].start)  # device order
  return np.concatenate([np.asarray(s.data)[0] for s in shards])[:32]  # indexed on the host


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, allow_data_change: bool = False
) -> dict:
  """Trains `config` on all devices, writing logs and checkpoints to `workdir`.

  Returns the final eval record. Raises Preempted after saving a checkpoint on SIGTERM or
  Ctrl-C. A resume on other data than `workdir` recorded is an error unless `allow_data_change`.
  The launch is the workdir's one writer while it runs (workdir.hold).
  """
  try:
    return _train_and_evaluate(config, Path(workdir), allow_data_change)
  finally:
    workdir_lib.release(Path(workdir))


def _train_and_evaluate(config, workdir: Path, allow_data_change: bool) -> dict:
  is_main = jax.process_index() == 0
  fine_tune = config.init_from and not (workdir / "checkpoints").is_dir()  # a resume: never
  training = setup(config, fine_tune=fine_tune)
  workdir_lib.hold(workdir, only_if_there=True)  # one writer: before a resume reads anything
  started_from = training.started_from
  inputs, num_steps = training.inputs, training.num_steps
  if inputs.fallback_reason and is_main:
    print(
      _banner(f"NO CIFAR-10: TRAINING ON SYNTHETIC DATA.\n{inputs.fallback_reason}"), flush=True
    )
  data_identity = _data_identity(inputs)
  workdir_lib.check_data(workdir, data_identity, allow_data_change)
  check_profile_end(config.profile_steps, num_steps)
  bar = tqdm.tqdm(
    total=num_steps, unit="step", disable=not (is_main and sys.stdout.isatty()), leave=False
  )
  echo = bar.write if not bar.disable else functools.partial(print, flush=True)
  every = training.checkpoint_every
  checkpoints = checkpoint.Checkpoints(workdir, for_module(config, checkpoint), echo, every)
  state, extra_times = _initial_state(training, checkpoints, workdir, started_from)
  start_step = steps.step_of(state)
  profiler = Profiler(config.profile_steps, workdir, start_step, echo)  # its window is checked here
  rstate, skipped_at_start = replicate(state), len(inputs.skipped_files())
  stream = inputs.batches(start_step)
  first_batch = next(stream)
  # Compiled before anything is written: a step the devices cannot hold, or a model that names
  # an axis the step lacks (steps.axis_checked), is an error line
  p_train_step = _compiled_step(training, rstate, first_batch, start_step, extra_times, echo)
  # All checked: from here on we write. This launch trains steps start_step + 1 to num_steps.
  workdir_lib.hold(workdir)  # a new workdir: made here, its lock taken before the first write
  workdir_lib.prepare(workdir, config, data_identity, (start_step, num_steps))
  bar.update(start_step)
  log = MetricsLog(
    workdir, dataset_used=inputs.name, enabled=is_main, echo=echo, resumed_at=start_step
  )
  if is_main:
    _announce(workdir, config.dataset, training, state, echo, started_from)
  _log_preview(log, training, start_step, first_batch)
  wait_for_all(f"compiled-{start_step}")  # the step's first collectives start together
  batches = itertools.chain([first_batch], stream)
  fields = for_module(config, progress_lib)  # what the records read of the config
  progress = Progress(fields, log, training, start_step, echo, checkpoints)
  # The signal handlers stay until the last checkpoint is on disk: a second Ctrl-C while it is
  # written aborts at once.
  with Preemption(every=config.log_every_steps) as preemption:
    if is_main and signal.SIGINT in preemption.ignored:
      echo(SIGINT_IGNORED)
    try:
      loop = Loop(training, progress, profiler, preemption, checkpoints, log, Clock(), bar, echo)
      rstate = loop.run(p_train_step, rstate, batches, start_step)
      final = loop.finish(rstate, start_step, extra_times)
    finally:
      _close(inputs, is_main, log, checkpoints, bar, stream)
  _note_skipped(workdir, inputs, skipped_at_start, echo if is_main else None)
  return final


SIGINT_IGNORED = (
  "note: this run started with SIGINT ignored (a script's background job): Ctrl-C does not "
  "stop it, SIGTERM does (docs/long_runs.md)"
)


def _log_preview(log, training: Training, start_step: int, first_batch) -> None:
  """The first seed's first batch, augmented as its step sees it: to TensorBoard and
  WORKDIR/augmented_batch.png."""
  inputs = training.inputs
  if inputs.point_axes is not None:
    first_batch = sweep_lib.point_part(first_batch, inputs.point_axes, 0, axis=1)
  preview = augmented_preview(inputs.gather, training.augment, start_step, first_batch)
  log.images("augmented_batch", preview, start_step)


@dataclasses.dataclass
class Loop:
  """The training loop's steps, with what it records and when it stops."""

  training: Training
  progress: Progress
  profiler: Profiler
  preemption: Preemption
  checkpoints: checkpoint.Checkpoints
  log: MetricsLog
  clock: Clock
  bar: tqdm.tqdm
  echo: Callable

  def run(self, p_train_step, rstate, batches, start_step: int):
    """Steps start_step + 1 to the run's last, `steps_per_call` a call (`step` is a call's
    last); the replicated state after them. A stop signal saves the state and raises
    Preempted."""
    clock, progress, num_steps = self.clock, self.progress, self.training.num_steps
    k = self.training.steps_per_call
    in_flight = []  # metrics of calls not yet logged
    for step in range(start_step + k, num_steps + 1, k):
      self.profiler.before(step - k + 1)
      batch = clock.next_input(batches)
      for _ in range(k - 1):  # the call's other steps: the same resident batch
        next(batches)
      rstate, metrics = p_train_step(rstate, batch)
      if step == start_step + k:  # a model whose statistics are its device's own stops here
        statistics_agree(rstate.batch_stats, self.training.model_name)
      in_flight.append(metrics)
      if len(in_flight) > 1:  # at most 2 calls in flight: the device always has the next one,
        jax.block_until_ready(in_flight[-2])  # and a signal or an error is seen within a call
      self.bar.update(k)
      logged = progress.due(step, clock)
      if logged:
        progress.write(step, in_flight, clock)
        in_flight = [] if progress.closes(step) else in_flight
        self.profiler.note(step, "a log line")
      self.profiler.after(step, rstate)
      if self.preemption.stop_after(step):  # agreed by all processes: all save this step
        if in_flight and not logged:  # the steps since the last record are recorded first
          progress.write(step, in_flight, clock)
        points = _swept(self.training)
        state = _finite_or_stop(first_replica(rstate), step, self.checkpoints, points)
        self.checkpoints.save(step, state)
        raise Preempted(step, self.preemption.interrupted)
      if step < num_steps:
        done = _periodic(step, rstate, self.training, self.log, clock, self.checkpoints, self.echo)
        for what in done:
          self.profiler.note(step, what)
    return rstate

  def finish(self, rstate, start_step: int, times: dict) -> dict:
    """The final eval's record, after the last checkpoint: a stop during the eval loses no
    training, and the write overlaps the eval (every view)."""
    jax.block_until_ready(rstate)
    train_sec = self.clock.training()  # compile, evals and checkpoints excluded
    self.preemption.training = False
    last = self.training.num_steps
    state = _finite_or_stop(first_replica(rstate), last, self.checkpoints, _swept(self.training))
    self.checkpoints.save(last, state)
    diverged = {"diverged": self.progress.diverged} if self.progress.diverged else {}
    final = evaluate(
      self.training, rstate, last, self.log, self.clock, train_sec=train_sec, **diverged, **times
    )
    if "point" in self.training.columns:
      self.log.sweep(final, self.training.loss_fields)
    if jax.process_index() == 0 and start_step < last:
      self.echo(
        f"trained steps {start_step + 1}-{last} in {train_sec:.1f} s (compile, evals and "
        "checkpoints excluded)"
      )
    return final


def statistics_agree(batch_stats, model_name: str) -> None:
  """A user error unless the step left the same `batch_stats` (replicated) on every device: a
  model that keeps statistics of its device's examples alone (a normalization that names no
  axis, and that the step cannot point at its axis as it does BatchNorm) would make the device
  count change its results, and the eval and the checkpoint disagree. Per leaf and device, the
  sum of magnitudes: a pmean'd statistic is the same on every device to the last bit, one of
  other examples differs by its sampling spread (percents); 1e-4 lies between."""
  leaves = jax.tree.leaves(batch_stats)
  if jax.device_count() == 1 or not leaves:
    return
  magnitude = lambda shard: np.abs(np.asarray(shard.data, np.float64)).sum()
  sums = lambda leaf: [magnitude(shard) for shard in leaf.addressable_shards]
  local = np.asarray([sums(leaf) for leaf in leaves]).T  # [local devices, leaves]
  if jax.process_count() > 1:  # every process decides on every device's, together
    local = gather_processes(local).reshape(-1, len(leaves))
  if np.all(np.abs(local - local[0]) <= 1e-4 * np.abs(local[0])):
    return
  raise UserError(
    f"model {model_name!r} keeps statistics (batch_stats) that differ across the devices after "
    "its first step: a normalization of its own averages over each device's examples alone, so "
    "the device count would change its results; average them over the step's axis "
    f"(lax.pmean(x, {AXIS!r}), research.steps.AXIS), or set batch_norm_statistics='per_device' "
    "to train with per-device statistics on purpose"
  )


def _initial_state(training: Training, checkpoints, workdir: Path, started_from):
  """(state, extra): the newest checkpoint's state (a user error where its step is past the
  run's or not a whole number of calls), else the initial one with the parameters the model
  computes from data; extra: what that took, and what the run took from `init_from`
  (`started_from`), for the final eval's record."""
  state = checkpoints.restore_latest(training.state)  # one that does not fit: UserError
  start_step, times = steps.step_of(state), ({"init_from": started_from} if started_from else {})
  if start_step > training.num_steps:
    raise UserError(
      f"{workdir} holds a checkpoint of step {start_step}, past this run's "
      f"{training.num_steps} steps; resume with num_train_steps >= {start_step}, or use a new "
      "--workdir"
    )
  if start_step % training.steps_per_call:  # a checkpoint of a run with another steps_per_call
    raise UserError(
      f"{workdir} resumes at step {start_step}, which steps_per_call={training.steps_per_call} "
      "does not divide; resume with a steps_per_call that divides it"
    )
  if not start_step and training.from_data:
    training.from_data.compile()  # off the clock, as the step's compile is
    start = time.perf_counter()
    state = training.from_data(state)
    times["init_from_data_sec"] = time.perf_counter() - start
  if not start_step and state.ema_params is not None:  # the average starts at the first weights
    state = state.replace(ema_params=state.params)
  return state, times


def _announce(
  workdir: Path, dataset_requested: str, training: Training, state, echo, started_from
) -> None:
  """Process 0's records and lines before the first step: metadata, the run, its data, what
  it took from `init_from` (`started_from`)."""
  start_step = steps.step_of(state)
  before = workdir_lib.last_recorded(workdir, "device_count") if start_step else None
  _write_metadata(workdir, dataset_requested, training)
  _describe(training, state, echo)
  for note in training.notes:
    echo(note)
  if training.inputs.summary:
    echo(training.inputs.summary + _list_left_out(workdir, training.inputs))
  if started_from:
    echo(init_from.describe(started_from))
  if start_step:
    echo(f"resumed from the checkpoint at step {start_step}")
  if before and before != jax.device_count():
    echo(
      f"note: the launch before this one ran on {before} devices, this one on "
      f"{jax.device_count()}: "
      + (
        f"the state and global batch are the same, the batches drawn from here on are not "
        f"those {before} devices would draw ({training.inputs.layout}; docs/long_runs.md)"
        if training.inputs.order_per_device
        else "the run continues as before: its batches do not depend on the device count"
      )
    )


_CACHE_HITS = [0]  # compiles JAX loaded from its persistent cache (JAX_COMPILATION_CACHE_DIR)


def _count_cache_hit(event: str, **_) -> None:
  if event == "/jax/compilation_cache/cache_hits":
    _CACHE_HITS[0] += 1


jax.monitoring.register_event_listener(_count_cache_hit)


def _compiled_step(training: Training, rstate, first_batch, start_step: int, times: dict, echo):
  """The step that is run: steps.train_step for ONE device (setup binds its data gathering,
  augmentation, loss and micro-batch), on every device in parallel, compiled ahead; the
  evals too. Their compile times go into `times`; `step_from_cache`: the step was loaded from
  JAX's persistent compilation cache (an earlier launch compiled it)."""
  start, hits = time.perf_counter(), _CACHE_HITS[0]
  step, compiled = compile_step(training, rstate, first_batch, start_step)
  times["compile_sec"] = time.perf_counter() - start
  times["step_from_cache"] = _CACHE_HITS[0] > hits
  check_step_metrics(compiled.out_info[1], len(training.seeds) > 1)  # (state, metrics)
  fit = points_that_fit(compiled, training.state, len(training.seeds), _swept(training) > 0)
  said = f"compiled the train step in {times['compile_sec']:.1f} s"
  if times["step_from_cache"]:
    said = f"loaded the train step from the compilation cache in {times['compile_sec']:.1f} s"
  for at, _ in step.programs[1:]:  # optim.frozen_from; at a call's first step
    first = -(-at // step.steps) * step.steps + 1
    said += f" (from step {first} without the gradients of groups whose learning rate is 0)"
  inputs = training.inputs
  if inputs.compile_evals:
    periodic = 0 < training.eval_every < training.num_steps
    start = time.perf_counter()
    inputs.compile_evals(rstate, (True, False) if periodic else (True,))
    times["eval_compile_sec"] = time.perf_counter() - start
    said += f", the eval in {times['eval_compile_sec']:.1f} s"
  if training.warm_up:
    start = time.perf_counter()
    step.warm_up(rstate, first_batch)
    if inputs.compile_evals:
      inputs.evaluate(rstate, True)
    said += f"; ran each once to warm up in {time.perf_counter() - start:.1f} s"
  if jax.process_index() == 0:
    echo(said)
    if fit:
      echo(fit)
  return step


def compile_step(training: Training, rstate, first_batch, start_step: int = 0):
  """(step, its first compiled program): the run's train step on every local device, compiled
  ahead (or loaded from JAX's persistent cache); `step(state, batch)` returns (state, metrics),
  donates (consumes) the state passed in, and runs, call after call from `start_step`, the
  program for the step the state is at (`Training.later_steps`). What a run trains with, and
  what the benchmarks time. The run's step count, (one seed) its seed and its float fields
  (`Training.hyper`) are arguments: a resume with more steps, or a run of another seed or
  learning rate, loads the same program."""
  run = [np.int32(training.num_steps)]
  if len(training.seeds) == 1:  # several points: sweep.each_point has their seeds' keys
    run.append(np.int32(training.seeds[0]))
  run.append(training.hyper)  # float32 scalars; a swept field's [points]
  run = [replicate(x) for x in run]
  programs = [(0, training.train_step), *training.later_steps]
  programs = [(at, fn) for i, (at, fn) in enumerate(programs) if _runs(programs, i, start_step)]
  compiled = []
  try:
    for at, train_step in programs:
      if training.steps_per_call > 1:
        train_step = _scanned(train_step, training.steps_per_call)
      p_train_step = jax.pmap(train_step, axis_name=AXIS, donate_argnums=(0,))
      compiled.append((at, p_train_step.lower(rstate, first_batch, *run).compile()))
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
    if not training.hyper:
      raise
    if any(np.ndim(v) for v in training.hyper.values()):
      raise UserError(SWEEP_IN_PYTHON) from None
    if jax.process_index() == 0:  # a fork's part reads a float field in Python
      print(HYPER_CONSTANT, flush=True)
    return compile_step(dataclasses.replace(training, hyper={}), rstate, first_batch, start_step)
  return CompiledStep(compiled, run, start_step, training.steps_per_call), compiled[0][1]


READ_IN_PYTHON = (
  "a part of this run reads one of its float fields in Python (an `if` on it, or an optax "
  "constructor that checks it)"
)
SWEEP_IN_PYTHON = (
  f"{READ_IN_PYTHON}, so the points of this sweep cannot share one program; launch a run per "
  "value (research/sweep.py: hyper_values)"
)
HYPER_CONSTANT = (
  f"note: {READ_IN_PYTHON}, so the step takes them as constants: a run with other values of "
  "them compiles its step anew (research/sweep.py: hyper_values)"
)


def _scanned(train_step, k: int):
  """`train_step` run `k` times in one program (lax.scan) on the same batch, the resident data
  and its epoch's order: each step takes its examples by the state's step count. The metrics
  come back stacked, [k, ...]."""

  def steps(state, batch, *run):
    return lax.scan(lambda state, _: train_step(state, batch, *run), state, None, length=k)

  return steps


def _runs(programs: list, i: int, start_step: int) -> bool:
  """Whether program `i` of [(first step count, step)] runs in a launch from `start_step`."""
  return i + 1 == len(programs) or programs[i + 1][0] > start_step


@dataclasses.dataclass
class CompiledStep:
  """`step(state, batch)`: the program for the step count `at` the state is at, the last of
  `programs` [(first step count, compiled)] that starts at or before it; `at` then counts on,
  by the `steps` one call runs."""

  programs: list
  run: list  # the arguments after (state, batch): the run's step count, its seed, its floats
  at: int
  steps: int = 1

  def __call__(self, state, batch):
    compiled = next(c for first, c in reversed(self.programs) if first <= self.at)
    self.at += self.steps
    return compiled(state, batch, *self.run)

  def warm_up(self, state, batch) -> None:
    """Each program once on a copy of `state` (the step donates its state), results dropped."""
    for _, compiled in self.programs:
      copy = jax.tree.map(lambda x: x.copy(), state)
      jax.block_until_ready(compiled(copy, batch, *self.run))


def free_device_bytes() -> int:
  """Bytes free on each local device: the allocator's limit less what is in use (GPU), or on CPU,
  whose devices share the host's memory, the host's available memory over the devices."""
  stats = jax.local_devices()[0].memory_stats()
  if stats and "bytes_limit" in stats:
    return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
  meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
  found = re.search(r"MemAvailable:\s+(\d+) kB", meminfo)
  available = (
    int(found[1]) * 1024 if found else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  )
  return available // jax.local_device_count()


def points_that_fit(compiled, state, points: int, sweep: bool = False) -> str:
  """For several points (seeds, or a `sweep`'s), the line that says how much memory their
  step takes on each device and about how many points fit ("" for one); a user error when
  these do not. The step's arguments (the data and the state) are already on the devices;
  each point adds its state and its share of what the step allocates besides (XLA's memory
  analysis of the step)."""
  if points == 1:
    return ""
  what = "points" if sweep else "seeds"
  memory = compiled.memory_analysis()
  step_bytes = memory.temp_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
  state_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
  per_point = (step_bytes + state_bytes) / points
  free = free_device_bytes()
  fit = points + int((free - step_bytes) // per_point)
  gib = lambda n: f"{n / 2**30:.2f} GiB"
  said = (
    f"{points} {what} in one program: their step takes {gib(step_bytes)} of each device besides "
    f"the state ({gib(per_point)} a {what[:-1]}, its state included), of {gib(free)} free"
  )
  if step_bytes > free:
    fewer = f"sweep {fit} points or fewer" if sweep else f"use --config.seeds={fit} or fewer"
    fewer = fewer if fit >= 1 else f"not one {what[:-1]} fits"
    raise UserError(f"{said}: they do not fit; {fewer}")
  return f"{said}: about {fit} {what} fit"


def evaluate(training: Training, rstate, step: int, log, clock, all_views=True, **extra) -> dict:
  """An eval record, logged; periodic evals (all_views=False) use the eval's first view only."""
  start = time.perf_counter()
  totals = training.inputs.evaluate(rstate.eval_weights(), all_views)
  record = eval_record(step, totals, training.columns)
  record["eval_weights"] = "params" if rstate.ema_params is None else "ema"
  record["eval_sec"] = time.perf_counter() - start
  record["elapsed_sec"] = clock.since_launch()  # this launch's wall clock, as train records'
  record.update(extra)
  log.eval(record)
  return record


def _swept(training: Training) -> int:
  """A sweep's point count, 0 for a run that sweeps no field (its seeds stop together)."""
  return len(training.seeds) if "point" in training.columns else 0


def _periodic(step: int, rstate, training: Training, log, clock, checkpoints, echo) -> tuple:
  """The periodic eval and checkpoint after `step`, off the training clock; what it did."""
  eval_due = training.eval_every and step % training.eval_every == 0
  save_due = checkpoints.due(step)
  if not (eval_due or save_due):
    return ()
  jax.block_until_ready(rstate)  # dispatched steps finish on the training clock
  with clock.pause():
    if eval_due:
      evaluate(training, rstate, step, log, clock, all_views=False)
    if save_due:
      start = time.perf_counter()
      state = _finite_or_stop(first_replica(rstate), step, checkpoints, _swept(training))
      checkpoints.save(step, state)
      echo(
        f"checkpoint at step {step}: training paused {time.perf_counter() - start:.3f} s "
        "(device→host copy; the write goes on in the background)"
      )
  return ("an eval",) * bool(eval_due) + ("a checkpoint",) * bool(save_due)


def _close(inputs: Inputs, is_main: bool, log, checkpoints, bar, stream) -> None:
  """The end of a launch, however it ends. The callbacks run last-registered first, each even
  if one before it raises: the decode workers stop, the bar, a checkpoint write in flight
  finishes (never left half-done), the log closes, and the synthetic-data banner comes last."""
  with contextlib.ExitStack() as cleanup:
    if inputs.fallback_reason and is_main:
      message = f"THIS RUN TRAINED ON SYNTHETIC DATA, NOT CIFAR-10.\n{inputs.fallback_reason}"
      cleanup.callback(print, _banner(message), flush=True)
    cleanup.callback(log.close)
    cleanup.callback(checkpoints.close)
    cleanup.callback(bar.close)
    cleanup.callback(getattr(stream, "close", lambda: None))


def _note_skipped(workdir: Path, inputs: Inputs, skipped_at_start: int, echo) -> None:
  """Streamed data finds undecodable files as it reads them: said, listed and recorded at the
  end (by process 0: `echo`; None elsewhere)."""
  skipped = len(inputs.skipped_files())
  if skipped == skipped_at_start or echo is None:
    return
  echo(f"skipped {skipped:,} undecodable files (skip_bad_images){_list_left_out(workdir, inputs)}")
  with open(workdir / workdir_lib.METADATA, "a") as f:
    f.write(json.dumps({"time": time.time(), "skipped_images": skipped}) + "\n")


LEFT_OUT = "data_left_out.txt"


def _list_left_out(workdir: Path, inputs: Inputs) -> str:
  """Writes the files of an image folder that the run left out to WORKDIR/data_left_out.txt,
  one a line with why ("undecodable" or "passed over"); says where, if there are any."""
  lines = [f"undecodable\t{p}" for p in inputs.skipped_files()]
  lines += [f"passed over\t{p}" for p in inputs.passed_over]
  if not lines:
    return ""
  (workdir / LEFT_OUT).write_text("\n".join(lines) + "\n")
  return f" (listed in {workdir / LEFT_OUT})"
