"""The training loop's bookkeeping: where its wall time goes, its log records, its profile.

research/train.py's loop dispatches steps; these objects keep what it needs to say about
them, so the loop itself stays a screen long.
"""

import contextlib
import time
from pathlib import Path

import jax
import numpy as np

from research import metrics as metrics_lib
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

  def close_interval(self) -> tuple[float, float]:
    """(training seconds, input wait seconds) since the last record; starts the next interval."""
    training, input_wait = self.since_interval() - self.paused, self.input_wait
    self.interval_start, self.input_wait, self.paused = time.perf_counter(), 0.0, 0.0
    return training, input_wait


class Progress:
  """A train record at log steps: one metrics fetch, the NaN check, the line and its notes."""

  def __init__(self, config, log, schedule, start_step: int, num_steps: int, echo, checkpoints):
    self.config, self.log, self.echo = config, log, echo
    self.schedule = jax.jit(schedule)  # one call per record, not one per jnp op in it
    self.start_step, self.num_steps = start_step, num_steps
    self.checkpoints = checkpoints  # named when training stops on NaN
    self.single_process = jax.process_count() == 1
    self.is_main = jax.process_index() == 0
    self.warned_long = False

  def due(self, step: int, clock: Clock) -> bool:
    """Every `log_every_steps`, the first and last step (feedback before a slow interval), and
    once `log_every_seconds` passed. Not by time with several processes: each stops on NaN at
    a log step, so those steps must be the same in all of them."""
    return (
      step % self.config.log_every_steps == 0
      or step in (self.start_step + 1, self.num_steps)
      or (self.single_process and clock.since_interval() >= self.config.log_every_seconds)
    )

  def write(self, step: int, in_flight: list, clock: Clock) -> None:
    fetched = first_replica(in_flight)  # one fetch; blocks until these steps are done
    training, input_wait = clock.close_interval()
    record = {
      "step": step,
      "loss": float(np.mean([m["loss"] for m in fetched])),
      "accuracy": float(np.mean([m["accuracy"] for m in fetched])),
      "param_norm": float(fetched[-1]["param_norm"]),
      "grad_norm": float(fetched[-1]["grad_norm"]),
      "learning_rate": float(self.schedule(step - 1)),
      "examples_per_sec": len(fetched) * self.config.batch_size / training,
      "sec_per_batch": training / len(fetched),
      "input_wait_fraction": input_wait / training,
      "elapsed_sec": clock.since_launch(),  # this launch, wall clock
      "eta_sec": (self.num_steps - step) * training / len(fetched),  # training only
    }
    if not all(np.isfinite(record[k]) for k in ("loss", "grad_norm", "param_norm")):
      raise UserError(
        f"loss, gradients or parameters became NaN/inf by step {step} (loss {record['loss']}); "
        f"{self.checkpoints.kept()}; lower learning_rate or set grad_clip_norm"
      )
    self.log.train(record)
    if not self.is_main:
      return
    if step > self.start_step + 1 and not self.warned_long:  # step 1 holds warm-up
      self.warned_long = self._warn_if_long(record, self.num_steps - step)
    if record["input_wait_fraction"] > INPUT_BOUND:
      self.echo(INPUT_BOUND_ADVICE.format(record["input_wait_fraction"]))

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


def check_profile_end(config, num_steps: int) -> None:
  """A user error if `profile_steps` ends after the run's last step: the trace would never be
  written. Checked once the step count is known (it may come from the data), before anything
  is written; Profiler checks the start against the resumed step."""
  window = tuple(config.profile_steps)
  if window and window[1] > num_steps:
    raise UserError(
      f"profile_steps={window} ends after step {num_steps}, this run's last, so the trace "
      f"would never be written; end it at step {num_steps} or before"
    )


class Profiler:
  """A jax.profiler trace of the steps in `profile_steps` (start, stop) into WORKDIR/profile."""

  def __init__(self, config, workdir: Path, resume_step: int, echo):
    self.window = tuple(config.profile_steps)
    self.directory, self.echo = Path(workdir) / "profile", echo
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

  def after(self, step: int, rstate) -> None:
    if self.window and step == self.window[1]:
      jax.block_until_ready(rstate)
      jax.profiler.stop_trace()
      self.echo(f"wrote a profile of steps {self.window[0]}-{self.window[1]} to {self.directory}")
