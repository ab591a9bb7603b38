"""The training loop's bookkeeping: where its wall time goes (Clock), its train records at log
steps (Progress: one metrics fetch, the NaN check, the console line) and its profile
(Profiler). research/train.py's loop calls them; they read what research/setup.py built.
"""

import contextlib
import time
from pathlib import Path

import jax
import numpy as np

from research import metrics as metrics_lib
from research import workdir as workdir_lib
from research.errors import UserError
from research.placement import first_replica

INPUT_BOUND = 0.1  # when the loop waits for input more than this share of the time, it says so
INPUT_BOUND_ADVICE = (
  "input-bound: the loop waited for input {:.0%} of the time; the devices idle while the "
  "host decodes. Raise data_workers (decode processes) or prefetch (batches in flight)."
)
LONG_RUN_SEC = 3600  # a projection beyond this is said once, with the faster ways


class Clock:
  """The loop's wall time since its last log record: training, input wait and pauses."""

  def __init__(self):
    self.launch_start = self.interval_start = time.perf_counter()
    self.input_wait = self.paused = self.all_paused = 0.0

  def next_input(self, batches):
    """`next(batches)`, its wait counted: none for resident data, decoding lag when streamed."""
    start = time.perf_counter()
    batch = next(batches)
    self.input_wait += time.perf_counter() - start
    return batch

  @contextlib.contextmanager
  def pause(self):
    """Eval and checkpoints inside are not training time."""
    start = time.perf_counter()
    yield
    paused = time.perf_counter() - start
    self.paused += paused
    self.all_paused += paused

  def since_interval(self) -> float:
    return time.perf_counter() - self.interval_start

  def since_launch(self) -> float:
    return time.perf_counter() - self.launch_start

  def training(self) -> float:
    """This launch's training time: its wall time less evals and checkpoints."""
    return self.since_launch() - self.all_paused

  def close_interval(self, close: bool = True) -> tuple[float, float]:
    """(training seconds, input wait seconds) since the last record; starts the next interval
    (unless not `close`: the next record's interval holds this one's)."""
    training, input_wait = self.since_interval() - self.paused, self.input_wait
    if close:
      self.interval_start, self.input_wait, self.paused = time.perf_counter(), 0.0, 0.0
    return training, input_wait


def _diverged_before(workdir: Path) -> dict:
  """The points of a sweep that diverged before this launch: its last record's `diverged`."""
  return workdir_lib.last_recorded(workdir, "diverged", "metrics.jsonl") or {}


# What Progress reads of the config (the run hands it a view of these, research/fields.py).
READS = ("log_every_steps", "log_every_seconds", "batch_size", "steps_per_call")


class Progress:
  """A train record at log steps: one metrics fetch, the NaN check, the line and its notes.
  `fields`: READS; `training`: the run setup.setup built (its schedules, length, seeds and
  points)."""

  def __init__(self, fields, log, training, start_step: int, echo, checkpoints):
    self.fields, self.log, self.echo = fields, log, echo
    # One call per record, not one per jnp op in it; compiled now, not inside the timed span
    rates = lambda step: {name: schedule(step) for name, schedule in training.schedules.items()}
    self.learning_rates = jax.jit(rates).lower(np.int32(0)).compile()
    self.start_step, self.num_steps = start_step, training.num_steps
    self.checkpoints = checkpoints  # named when training stops on NaN
    self.seeds, self.columns = training.seeds, training.columns
    # a sweep's points that diverged: {label: the log step that found it}, a resumed run's too
    self.diverged = _diverged_before(log.workdir) if "point" in self.columns else {}
    self.single_process = jax.process_count() == 1
    self.is_main = jax.process_index() == 0
    self.warned_long = False

  def due(self, step: int, clock: Clock) -> bool:
    """Every `log_every_steps`, the first and last call (feedback before a slow interval), and
    once `log_every_seconds` passed. Not by time with several processes: each stops on NaN at
    a log step, so those steps must be the same in all of them."""
    first = self.start_step + self.fields.steps_per_call  # the first call's last step
    return (
      step % self.fields.log_every_steps == 0
      or step in (first, self.num_steps)
      or (self.single_process and clock.since_interval() >= self.fields.log_every_seconds)
    )

  def closes(self, step: int) -> bool:
    """Whether the record at `step` closes its window: every record but the first call's
    extra one (a launch's first feedback), so that the record at a multiple of
    `log_every_steps` covers the steps since the one before, on a resumed run as on one run."""
    first = self.start_step + self.fields.steps_per_call
    return step != first or step % self.fields.log_every_steps == 0 or step == self.num_steps

  def write(self, step: int, in_flight: list, clock: Clock) -> None:
    """The record of the steps of `in_flight` (those since the last record that closed)."""
    fetched = first_replica(in_flight)  # one fetch; blocks until these steps are done
    if self.fields.steps_per_call > 1:  # each call's metrics [steps, ...]: a dict a step
      fetched = [{n: v[i] for n, v in m.items()} for m in fetched for i in range(len(m["loss"]))]
    training, input_wait = clock.close_interval(self.closes(step))
    # Each a number, or one per point (seeds, a sweep): their mean is the record's. Every
    # metric the step returns is averaged over the steps since the last record; the norms are
    # the last step's. A sweep's learning rates: each point's.
    last = lambda name: name in ("param_norm", "grad_norm")
    values = {
      name: np.asarray(fetched[-1][name]) if last(name) else np.mean([m[name] for m in fetched], 0)
      for name in fetched[-1]
    }
    rates = {k: np.asarray(v) for k, v in self.learning_rates(np.int32(step - 1)).items()}
    values |= {k: v for k, v in rates.items() if v.ndim}
    record = {
      "step": step,
      **{name: float(np.mean(v)) for name, v in values.items()},
      **{k: float(v) for k, v in rates.items() if not v.ndim},
      "examples_per_sec": len(fetched) * self.fields.batch_size / training,
      "sec_per_batch": training / len(fetched),
      "input_wait_fraction": input_wait / training,
      "elapsed_sec": clock.since_launch(),  # this launch, wall clock
      "eta_sec": (self.num_steps - step) * training / len(fetched),  # training only
    }
    several = len(self.seeds) > 1
    if several:
      record.update(metrics_lib.per_point(values, self.columns))
    self._stop_on_nan(step, record, values)
    self.log.train(record)
    if not self.is_main:
      return
    first_call = self.start_step + self.fields.steps_per_call  # it holds warm-up
    if step > first_call and not self.warned_long:
      self.warned_long = self._warn_if_long(record, self.num_steps - step)
    if record["input_wait_fraction"] > INPUT_BOUND:
      self.echo(INPUT_BOUND_ADVICE.format(record["input_wait_fraction"]))

  def _stop_on_nan(self, step: int, record: dict, values: dict) -> None:
    """Stops the run where its loss, gradients or parameters are not finite; in a sweep only
    where no point's are: a point that diverged is named once, and the others go on (its
    numbers leave the best point and the ranges)."""
    finite = np.all([np.isfinite(values[k]) for k in ("loss", "grad_norm", "param_norm")], 0)
    finite = np.broadcast_to(finite, len(self.seeds))
    labels = self.columns.get("point")
    if labels and finite.any():
      for label, ok in zip(labels, finite, strict=True):
        if not ok and label not in self.diverged:
          self.diverged[label] = step
          if self.is_main:
            self.echo(
              f"point {label} diverged by step {step} (its loss, gradients or parameters are "
              "NaN/inf): its numbers leave the best point and the ranges; the other points go on"
            )
      if self.diverged:
        record["diverged"] = dict(self.diverged)
      return
    if not finite.all():
      which = [s for s, fine in zip(labels or self.seeds, finite, strict=True) if not fine]
      where = f" in {'point' if labels else 'seed'} {', '.join(map(str, which))}"
      raise UserError(
        f"loss, gradients or parameters became NaN/inf by step {step}"
        f"{where if len(self.seeds) > 1 else ''} (loss {record['loss']}); "
        f"{self.checkpoints.kept()}; lower learning_rate or set grad_clip_norm"
      )

  def _warn_if_long(self, record: dict, steps_left: int) -> bool:
    """Says once if the rest is projected to take over LONG_RUN_SEC; True if it did."""
    if record["eta_sec"] <= LONG_RUN_SEC:
      return False
    self.echo(
      f"note: at {record['sec_per_batch']:.3g} s/step the {steps_left:,} steps left take about "
      f"{metrics_lib.duration(record['eta_sec'])} on {jax.device_count()} "
      f"{jax.devices()[0].device_kind} device(s). Faster: the config's :smoke variant "
      "(seconds), fewer steps (--config.num_epochs=N or --config.num_train_steps=N), or a GPU."
    )
    return True


def check_profile_end(profile_steps, num_steps: int) -> None:
  """A user error if `profile_steps` ends after the run's last step: the trace would never be
  written. Checked once the step count is known (it may come from the data), before anything
  is written; Profiler checks the start against the resumed step."""
  window = tuple(profile_steps)
  if window and window[1] > num_steps:
    raise UserError(
      f"profile_steps={window} ends after step {num_steps}, this run's last, so the trace "
      f"would never be written; end it at step {num_steps} or before"
    )


class Profiler:
  """A jax.profiler trace of the steps in `profile_steps` (start, stop) into WORKDIR/profile.
  Its closing line names what else the window held (a log line's fetch, an eval, a
  checkpoint), which a profile of steady steps lacks; `python -m tools.profile_summary`
  sums the trace by kind of op."""

  def __init__(self, profile_steps, workdir: Path, resume_step: int, echo):
    self.window = tuple(profile_steps)
    self.directory, self.echo = Path(workdir) / "profile", echo
    self.held = []  # what the window held besides steps: "a log line at step 12", ...
    self.active = False  # the trace records
    if self.window and self.window[0] <= resume_step:  # checked before the workdir is written
      length = self.window[1] - self.window[0]
      what = "lies wholly before" if self.window[1] <= resume_step else "starts at or before"
      raise UserError(
        f"profile_steps={self.window} {what} step {resume_step}, where this run resumes, so it "
        f"would not profile what you asked; use e.g. --config.profile_steps="
        f"'({resume_step + 1}, {resume_step + 1 + length})'"
      )

  def before(self, step: int) -> None:
    if self.window and step == self.window[0]:
      jax.profiler.start_trace(str(self.directory))
      self.active = True

  def note(self, step: int, what: str) -> None:
    """`what` happened after `step`: while the trace records, not a steady step's work."""
    if self.active:
      self.held.append(f"{what} at step {step}")

  def after(self, step: int, rstate) -> None:
    if self.window and step == self.window[1]:
      jax.block_until_ready(rstate)
      jax.profiler.stop_trace()
      self.active = False
      first, last = self.window
      held = f"; it holds {', '.join(self.held)}" if self.held else ": steady steps only"
      self.echo(f"wrote a profile of steps {first}-{last} to {self.directory}{held}")
