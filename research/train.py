"""The training loop: pmap the single-device step, feed it, log, evaluate, checkpoint.

Where the data lives and how a batch reaches the step is research/inputs.py; what one
device does in a step is research/steps.py. The host here only dispatches steps, fetches
metrics every `log_every_steps`, and times how long it waited for input.
"""

import dataclasses
import functools
import importlib.metadata
import itertools
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import flax
import jax
import ml_collections
import numpy as np
import tqdm
from jax.experimental import multihost_utils

from research import augment as augment_lib
from research import checkpoint, environment, models, optim, validate
from research import inputs as inputs_lib
from research import metrics as metrics_lib
from research import workdir as workdir_lib
from research.data import STREAMED, folder
from research.data.load import load_in_memory
from research.errors import UserError
from research.inputs import Inputs
from research.metrics import MetricsLog
from research.placement import first_replica, replicate
from research.preemption import Preempted, Preemption
from research.steps import AXIS, TrainState, create_train_state

# When the loop waits for input more than this share of the time, the log says so.
INPUT_BOUND = 0.1
INPUT_BOUND_ADVICE = (
  "input-bound: the loop waited for input {:.0%} of the time; the devices idle while the "
  "host decodes. Raise data_workers (decode processes) or prefetch (batches in flight)."
)


def _banner(text: str) -> str:
  line = "!" * 100
  return f"\n{line}\n{text}\n{line}\n"


def _write_metadata(workdir: Path, config, run: "Setup") -> None:
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
    "per_device_batch": run.per_device_batch,
    "micro_batch": run.micro_batch,  # examples per forward/backward pass (auto or configured)
    "device_kind": jax.devices()[0].device_kind,
    "process_count": jax.process_count(),
    "dataset_requested": config.dataset,
    "dataset_used": run.inputs.name,
    "dataset_source": run.inputs.source,
    "fallback_reason": run.inputs.fallback_reason,
    "skipped_images": run.inputs.skipped_images(),  # undecodable files skipped (skip_bad_images)
    "packages": dict(sorted(packages.items())),  # installed versions
  }
  with open(workdir / "metadata.jsonl", "a") as f:  # one record per launch (resumes append)
    f.write(json.dumps(meta) + "\n")


def _interval_record(step, fetched, elapsed, input_wait, config, schedule) -> dict:
  """One train record from the metrics of the steps since the last one."""
  return {
    "step": step,
    "loss": float(np.mean([m["loss"] for m in fetched])),
    "accuracy": float(np.mean([m["accuracy"] for m in fetched])),
    "param_norm": float(fetched[-1]["param_norm"]),
    "grad_norm": float(fetched[-1]["grad_norm"]),
    "learning_rate": float(schedule(step - 1)),
    "examples_per_sec": len(fetched) * config.batch_size / elapsed,
    "sec_per_batch": elapsed / len(fetched),
    "input_wait_fraction": input_wait / elapsed,
  }


LONG_RUN_SEC = 3600  # a projection beyond this is said once, with the faster ways


def _warn_if_long(record: dict, steps_left: int, echo) -> bool:
  """Says once if the rest of the run is projected to take over LONG_RUN_SEC; True if it did."""
  if record["eta_sec"] <= LONG_RUN_SEC:
    return False
  echo(
    f"note: at {record['sec_per_batch']:.3g} s/step the {steps_left:,} steps left take about "
    f"{metrics_lib.duration(record['eta_sec'])} on {jax.device_count()} "
    f"{jax.devices()[0].device_kind} device(s). Faster: the config's :smoke variant (seconds), "
    "fewer steps (--config.num_epochs=N or --config.num_train_steps=N), or a GPU host."
  )
  return True


def _finite_or_stop(state, step: int, checkpoints):
  """`state` if all its parameters are finite; otherwise stop before it is saved."""
  if not all(np.isfinite(x).all() for x in jax.tree.leaves(state.params)):
    raise UserError(
      f"parameters became NaN/inf by step {step}; the last good checkpoint is kept in "
      f"{checkpoints.directory}; lower learning_rate or set grad_clip_norm"
    )
  return state


def _make_inputs(config, **kwargs) -> Inputs:
  """Opens the config's data, resident on the devices or streamed from host workers."""
  scanned = None
  if config.dataset == "folder":
    scanned = folder.scan(config.data_dir, config.skip_bad_images)
    folder.check_num_classes(scanned, config.model.num_classes)
  placement = config.data_placement  # folder only; tfds datasets always stream
  if scanned is not None and placement == "auto":
    placement = (
      "resident" if folder.fits_on_devices(scanned, config.resident_max_gb) else "streamed"
    )
  streamed = config.dataset in STREAMED or (scanned is not None and placement == "streamed")
  if streamed:
    for field in ("augment", "eval_preprocess"):  # streamed images are padded squares
      if not augment_lib.build(config[field]).windowed:
        raise UserError(
          f"{field}={config[field]!r} must start with a window op (inception_crop or "
          "central_crop) for streamed data: the host pads images to squares and the op reads "
          "only each image's valid part"
        )
    environment.check(environment.STREAMED)
    from research.data import streaming  # grain (and tfds): only streamed datasets need them

    return streaming.inputs(config, scanned=scanned, **kwargs)
  if scanned is not None:
    return inputs_lib.resident(
      config, folder.load_resident(scanned, config.skip_bad_images), **kwargs
    )
  return inputs_lib.resident(config, load_in_memory(config), **kwargs)


@dataclasses.dataclass
class Setup:
  """Everything a run needs before its first step: data, initial state, schedule, length."""

  inputs: Inputs
  state: TrainState
  schedule: Callable
  num_steps: int
  per_device_batch: int
  micro_batch: int  # examples per forward/backward pass on each device


def setup(config: ml_collections.ConfigDict) -> Setup:
  """Validates `config`, opens its data and builds the initial state; writes nothing."""
  per_device_batch = validate.train_config(config, jax.device_count())  # before data loading
  augment = augment_lib.build(config.augment)
  preprocess = augment_lib.build(config.eval_preprocess)
  model = models.create(config.model, AXIS)
  init_key, shuffle_key, step_key = jax.random.split(jax.random.key(config.seed), 3)
  step_kwargs = dict(
    augment=augment,
    num_classes=config.model.num_classes,
    label_smoothing=config.label_smoothing,
    aux_loss_weight=config.aux_loss_weight,
  )
  inputs = _make_inputs(
    config,
    step_kwargs=step_kwargs,
    preprocess=preprocess,
    keys=(shuffle_key, step_key),
    per_device_batch=per_device_batch,
  )
  num_steps = config.num_train_steps
  if num_steps <= 0:
    num_steps = config.num_epochs * inputs.steps_per_epoch
  schedule = optim.learning_rate_schedule(config, inputs.steps_per_epoch, num_steps)
  tx = optim.create_optimizer(config, schedule)
  model_input = jax.eval_shape(augment, init_key, np.zeros((1, *inputs.example_shape), np.uint8))
  state = create_train_state(init_key, config, model, model_input.shape[1:], tx)
  micro_batch = validate.micro_batch(
    config, per_device_batch, batch_norm=bool(state.batch_stats), backend=jax.default_backend()
  )  # known only now (does the model have BatchNorm?), so added to the step here
  train_step = functools.partial(inputs.train_step, micro_batch=micro_batch)
  inputs = dataclasses.replace(inputs, train_step=train_step)
  return Setup(inputs, state, schedule, num_steps, per_device_batch, micro_batch)


def _data_identity(inputs: Inputs) -> dict:
  """What must not change when a run resumes: the same in every process."""
  data = {
    "dataset": inputs.name,
    "synthetic_fallback": bool(inputs.fallback_reason),
    "content": inputs.fingerprint,
  }
  if jax.process_count() > 1:
    digest = np.frombuffer(bytes.fromhex(inputs.fingerprint)[:4], np.int32)[0]
    digests = multihost_utils.process_allgather(np.int32(digest + data["synthetic_fallback"]))
    if len(set(digests.tolist())) > 1:
      raise UserError(
        f"the processes of this run read different data (process {jax.process_index()}: "
        f"{inputs.name} from {inputs.source}); give every host the same data_dir contents"
      )
  return data


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, allow_data_change: bool = False
) -> dict:
  """Trains `config` on all devices, writing logs and checkpoints to `workdir`.

  Returns the final eval record. Raises Preempted after saving a checkpoint on SIGTERM or
  Ctrl-C.
  A resume on other data than `workdir` recorded is an error unless `allow_data_change`.
  """
  workdir = Path(workdir)
  is_main = jax.process_index() == 0
  n_devices = jax.device_count()
  run = setup(config)
  inputs, state, schedule, num_steps = run.inputs, run.state, run.schedule, run.num_steps
  per_device_batch = run.per_device_batch
  if inputs.fallback_reason and is_main:
    print(
      _banner(f"NO CIFAR-10: TRAINING ON SYNTHETIC DATA.\n{inputs.fallback_reason}"), flush=True
    )

  data_identity = _data_identity(inputs)
  workdir_lib.check_data(workdir, data_identity, allow_data_change)
  bar = tqdm.tqdm(
    total=num_steps, unit="step", disable=not (is_main and sys.stdout.isatty()), leave=False
  )
  echo = bar.write if not bar.disable else functools.partial(print, flush=True)
  checkpoints = checkpoint.Checkpoints(workdir, config, echo=echo)
  state = checkpoints.restore_latest(state)  # a checkpoint that does not fit: UserError
  start_step = int(state.step)
  validate.profile_window(config, start_step)
  workdir_lib.prepare(workdir, config, data_identity)  # all checked: from here on we write
  bar.update(start_step)
  log = MetricsLog(workdir, dataset_used=inputs.name, enabled=is_main, echo=echo)
  if is_main:
    _write_metadata(workdir, config, run)
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    micro = f" in micro-batches of {run.micro_batch}" if run.micro_batch < per_device_batch else ""
    echo(
      f"{config.model.name}: {n_params:,} parameters | {n_devices} devices "
      f"({jax.devices()[0].device_kind}) | global batch {config.batch_size} = "
      f"{per_device_batch} per device{micro} | {inputs.steps_per_epoch} steps/epoch, "
      f"{num_steps} steps"
      f" | data: {inputs.name} ({inputs.source})"
    )
    if start_step:
      echo(f"resumed from the checkpoint at step {start_step}")

  rstate = replicate(state)
  skipped_at_start = inputs.skipped_images()

  def evaluate(step):
    totals = inputs.evaluate(rstate)
    record = {
      "step": step,
      "eval_loss": float(totals["loss_sum"] / totals["count"]),
      "eval_accuracy": float(totals["correct"] / totals["count"]),
      "eval_examples": int(totals["count"]),
      "elapsed_sec": time.perf_counter() - loop_start,  # this launch's wall clock, as train's
    }
    log.eval(record)
    return record

  stream = inputs.batches(start_step)
  first_batch = next(stream)
  log.images("augmented_batch", inputs.preview(start_step, first_batch), start_step)
  compile_start = time.perf_counter()
  p_train_step = jax.pmap(inputs.train_step, axis_name=AXIS, donate_argnums=(0,))
  p_train_step = p_train_step.lower(rstate, first_batch).compile()
  if is_main:
    echo(f"compiled the train step in {time.perf_counter() - compile_start:.1f} s")
  batches = itertools.chain([first_batch], stream)

  profile = tuple(config.profile_steps)
  pending, input_wait, paused, warned_long = [], 0.0, 0.0, False
  single_process = jax.process_count() == 1
  interval_start = loop_start = time.perf_counter()
  # The signal handlers stay until the last checkpoint is on disk: a second Ctrl-C while it is
  # written aborts at once.
  with Preemption(every=config.log_every_steps) as preemption:
    try:
      for step in range(start_step + 1, num_steps + 1):
        if profile and step == profile[0]:
          jax.profiler.start_trace(str(workdir / "profile"))
        wait_start = time.perf_counter()
        batch = next(batches)  # resident: returns at once; streamed: waits if decoding lags
        input_wait += time.perf_counter() - wait_start
        rstate, metrics = p_train_step(rstate, batch)
        pending.append(metrics)
        if len(pending) > 1:  # at most 2 steps in flight: the device always has the next one,
          jax.block_until_ready(pending[-2])  # and SIGTERM or an error is seen within a step
        bar.update(1)
        # The first step is logged too (as the TF scripts did): feedback before a slow interval.
        # Slow steps are logged on time as well, so no run is silent for long. Not with several
        # processes: each stops on NaN at a log step, so those steps must be the same in all.
        if (
          step % config.log_every_steps == 0
          or step in (start_step + 1, num_steps)
          or (single_process and time.perf_counter() - interval_start >= config.log_every_seconds)
        ):
          fetched = [first_replica(m) for m in pending]  # blocks until these steps are done
          elapsed = time.perf_counter() - interval_start - paused  # training time only
          record = _interval_record(step, fetched, elapsed, input_wait, config, schedule)
          record["elapsed_sec"] = time.perf_counter() - loop_start  # this launch, wall clock
          record["eta_sec"] = (num_steps - step) * record["sec_per_batch"]  # training only
          if not (np.isfinite(record["loss"]) and np.isfinite(record["grad_norm"])):
            raise UserError(
              f"loss or gradients became NaN/inf by step {step} (loss {record['loss']}); "
              f"the last good checkpoint is kept in {checkpoints.directory}; "
              "lower learning_rate or set grad_clip_norm"
            )
          log.train(record)
          if step > start_step + 1 and not warned_long and is_main:  # step 1 holds warm-up
            warned_long = _warn_if_long(record, num_steps - step, echo)
          if record["input_wait_fraction"] > INPUT_BOUND and is_main:
            echo(INPUT_BOUND_ADVICE.format(record["input_wait_fraction"]))
          pending, input_wait, paused = [], 0.0, 0.0
          interval_start = time.perf_counter()
        if profile and step == profile[1]:
          jax.block_until_ready(rstate)
          jax.profiler.stop_trace()
          echo(f"wrote a profile of steps {profile[0]}-{profile[1]} to {workdir / 'profile'}")
        if preemption.stop_after(step):  # agreed by all processes: all save this step
          checkpoints.save(step, first_replica(rstate))
          raise Preempted(step, preemption.interrupted)
        eval_due = config.eval_every_steps and step % config.eval_every_steps == 0
        if (eval_due or checkpoints.due(step)) and step < num_steps:
          jax.block_until_ready(rstate)  # dispatched steps finish on the training clock
          pause_start = time.perf_counter()  # eval and checkpoints are not training time
          if eval_due:
            evaluate(step)
          if checkpoints.due(step):
            checkpoint_start = time.perf_counter()
            checkpoints.save(step, _finite_or_stop(first_replica(rstate), step, checkpoints))
            blocked = time.perf_counter() - checkpoint_start
            echo(
              f"checkpoint at step {step}: training paused {blocked:.3f} s (device→host copy; "
              "the write goes on in the background)"
            )
          paused += time.perf_counter() - pause_start
      final = evaluate(num_steps)
      checkpoints.save(num_steps, _finite_or_stop(first_replica(rstate), num_steps, checkpoints))
    finally:
      getattr(stream, "close", lambda: None)()  # streamed: stop the decode workers
      bar.close()
      checkpoints.close()  # a write in flight is finished, never left half-done
      log.close()
  if inputs.fallback_reason and is_main:
    print(_banner(f"THIS RUN TRAINED ON SYNTHETIC DATA, NOT CIFAR-10.\n{inputs.fallback_reason}"))
  if skipped_at_start != inputs.skipped_images() and is_main:  # streamed: counted as read
    echo(f"skipped {inputs.skipped_images()} reads of undecodable files (skip_bad_images)")
    with open(workdir / "metadata.jsonl", "a") as f:
      f.write(json.dumps({"time": time.time(), "skipped_images": inputs.skipped_images()}) + "\n")
  return final
