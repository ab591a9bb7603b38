"""Where a run's numbers go: the console, WORKDIR/metrics.jsonl and TensorBoard event files;
and the eval metrics a config adds, found by name.

An eval metric is `metric(logits, labels) -> [batch]`, a value per example (logits float32
[batch, classes] as the eval computes them, every view averaged; labels int32 [batch]),
registered with `@research.metrics.register("name")` in a module of `config.modules` and
named in `config.eval_metrics`. It is summed over the test split, each example once, and
divided by their count, as accuracy is: `eval_NAME` in every eval record (each seed's too),
the eval line, TensorBoard and `./launch.sh eval`.
"""

import json
import time
from pathlib import Path

import numpy as np
from PIL import Image

from research.registry import Registry

EVAL_METRICS = Registry("eval metric", "eval_metrics")
register = EVAL_METRICS.register

TRAIN_SCALARS = (
  "loss",
  "accuracy",
  "learning_rate",
  "examples_per_sec",
  "sec_per_batch",
  "input_wait_fraction",
  "param_norm",
  "grad_norm",
)
RECORD_KEYS = ("step", "elapsed_sec", "eta_sec", "per_seed", "dataset_used", "time")


def step_metrics(record: dict) -> list[str]:
  """The names of the metrics a fork's step adds to a train record, beyond TRAIN_SCALARS."""
  own = lambda k: k in TRAIN_SCALARS + RECORD_KEYS or k.startswith("learning_rate/")
  return [k for k in record if not own(k) and not k.endswith("_std")]


def group_learning_rates(record: dict) -> list[str]:
  """The record's parameter groups' learning rates: `learning_rate/GROUP`."""
  return [k for k in record if k.startswith("learning_rate/")]


def duration(seconds: float) -> str:
  """`0:04:05`, or `11d 03:12:00` past a day."""
  minutes, sec = divmod(round(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  days, hours = divmod(hours, 24)
  return (f"{days}d " if days else "") + f"{hours}:{minutes:02d}:{sec:02d}"


def per_seed(values: dict, seeds) -> dict:
  """What a record of several seeds (`config.seeds` > 1) adds to their means: each value's
  standard deviation over the seeds (`NAME_std`, n - 1 in the denominator) and, under
  `per_seed`, the seeds and each seed's values in that order."""
  values = {name: np.asarray(v, np.float64) for name, v in values.items()}
  added = {f"{name}_std": float(np.std(v, ddof=1)) for name, v in values.items()}
  added["per_seed"] = {"seed": list(seeds), **{name: v.tolist() for name, v in values.items()}}
  return added


def _spread(record: dict, name: str, digits: int) -> str:
  """`0.1234`, or `0.1234 ± 0.0056` for a record of several seeds."""
  std = record.get(f"{name}_std")
  return f"{record[name]:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def format_train_line(record: dict) -> str:
  """The line the original TensorFlow scripts printed, then what we add to it. With several
  seeds: their mean ± standard deviation."""
  return (
    f"step {record['step']}, loss = {_spread(record, 'loss', 4)} "
    f"({record['examples_per_sec']:.1f} examples/sec; {record['sec_per_batch']:.3f} sec/batch)"
    f" accuracy {_spread(record, 'accuracy', 3)}, input wait "
    f"{100 * record['input_wait_fraction']:.1f}%,"
    f" elapsed {duration(record['elapsed_sec'])}, ETA {duration(record['eta_sec'])}"
    + "".join(f", {name} {_spread(record, name, 4)}" for name in step_metrics(record))
  )


def eval_record(step: int, totals: dict, seeds=()) -> dict:
  """The eval record of `totals` (steps.eval_sums summed over the test split). Its loss is
  cross-entropy whatever loss the run trains by (`config.loss`, its train records' `loss`).
  Totals of several `seeds` (one value per seed): their means, and `per_seed`."""
  count = np.asarray(totals["count"], np.float64)
  values = {
    "eval_loss": np.asarray(totals["loss_sum"]) / count,
    "eval_accuracy": np.asarray(totals["correct"]) / count,
  }
  if "correct_first_view" in totals:  # test-time augmentation: the plain accuracy too
    values["eval_accuracy_first_view"] = np.asarray(totals["correct_first_view"]) / count
  for name in eval_metric_names(totals):
    values[f"eval_{name}"] = np.asarray(totals[f"metric/{name}"]) / count
  record = {
    "step": step,
    "eval_loss": float(np.mean(values["eval_loss"])),
    "eval_loss_kind": "cross_entropy",
    "eval_accuracy": float(np.mean(values["eval_accuracy"])),
    "eval_examples": int(count.reshape(-1)[0]),  # every seed counts the same examples
  }
  if "eval_accuracy_first_view" in values:
    record["eval_accuracy_first_view"] = float(np.mean(values["eval_accuracy_first_view"]))
  for name in eval_metric_names(totals):
    record[f"eval_{name}"] = float(np.mean(values[f"eval_{name}"]))
  if count.ndim:
    record.update(per_seed(values, seeds))
  return record


def eval_metric_names(totals: dict) -> list[str]:
  """The registered eval metrics whose sums `totals` holds (steps.eval_sums' `metric/NAME`)."""
  return [k.removeprefix("metric/") for k in totals if k.startswith("metric/")]


def _added_eval_metrics(record: dict) -> list[str]:
  """The record's `eval_NAME` fields of registered eval metrics."""
  return [k for k in record if k.startswith("eval_") and k[len("eval_") :] in EVAL_METRICS.parts]


def format_eval_line(record: dict) -> str:
  views = record.get("eval_accuracy_first_view")
  seeds = record.get("per_seed", {}).get("eval_accuracy")
  return (
    f"eval at step {record['step']}: loss = {_spread(record, 'eval_loss', 4)}, "
    f"accuracy = {_spread(record, 'eval_accuracy', 4)}"
    + (f" with test-time augmentation ({views:.4f} without)" if views is not None else "")
    + "".join(
      f", {k.removeprefix('eval_')} = {_spread(record, k, 4)}" for k in _added_eval_metrics(record)
    )
    + f" over {record['eval_examples']} examples"
    + (f" (each seed: {', '.join(f'{a:.4f}' for a in seeds)})" if seeds else "")
  )


def image_grid(images: np.ndarray, columns: int = 8) -> np.ndarray:
  """Tiles float images [N, H, W, C] (any range: each is min-max scaled) into uint8 [H', W', C]."""
  n, h, w, c = images.shape
  low = images.min(axis=(1, 2, 3), keepdims=True)
  high = images.max(axis=(1, 2, 3), keepdims=True)
  scaled = (images - low) / np.maximum(high - low, 1e-6)
  rows = -(-n // columns)
  grid = np.ones((rows * (h + 2), columns * (w + 2), c), np.float32)  # white 2-px borders
  for i, image in enumerate(scaled):
    y, x = (i // columns) * (h + 2), (i % columns) * (w + 2)
    grid[y + 1 : y + 1 + h, x + 1 : x + 1 + w] = image
  return (grid * 255).round().astype(np.uint8)


class MetricsLog:
  """Prints records, appends them to metrics.jsonl and writes TensorBoard scalars/images.

  Only process 0 writes (`enabled`); `echo` prints a line (tqdm.write while a bar is shown).
  """

  def __init__(self, workdir: str, *, dataset_used: str, enabled: bool = True, echo=print):
    self.workdir = Path(workdir)
    self.dataset_used = dataset_used
    self.enabled = enabled
    self.echo = echo
    self.writer = None
    if enabled:
      from tensorboardX import SummaryWriter  # imported only where it writes

      self.writer = SummaryWriter(str(self.workdir / "tensorboard"), flush_secs=30)

  def _append(self, record: dict) -> None:
    record = {**record, "dataset_used": self.dataset_used, "time": time.time()}
    with open(self.workdir / "metrics.jsonl", "a") as f:
      f.write(json.dumps(record) + "\n")

  def train(self, record: dict) -> None:
    if not self.enabled:
      return
    self.echo(format_train_line(record))
    self._append(record)
    for name in (*TRAIN_SCALARS, *step_metrics(record), *group_learning_rates(record)):
      self.writer.add_scalar(f"train/{name}", record[name], record["step"])
    self._per_seed("train", record)

  def eval(self, record: dict) -> None:
    if not self.enabled:
      return
    self.echo(format_eval_line(record))
    self._append(record)
    for name in ("eval_loss", "eval_accuracy", *_added_eval_metrics(record)):
      self.writer.add_scalar(f"eval/{name.removeprefix('eval_')}", record[name], record["step"])
    self._per_seed("eval", record)
    self.writer.flush()

  def _per_seed(self, group: str, record: dict) -> None:
    """Each seed's values of a record of several seeds, tagged `GROUP/NAME/seed_N`."""
    seeds = record.get("per_seed", {})
    for name, values in seeds.items():
      if name == "seed":
        continue
      for seed, value in zip(seeds["seed"], values, strict=True):
        tag = f"{group}/{name.removeprefix('eval_')}/seed_{seed}"
        self.writer.add_scalar(tag, value, record["step"])

  def images(self, tag: str, images: np.ndarray, step: int) -> None:
    """Writes a grid of `images` [N, H, W, C] to TensorBoard and to WORKDIR/<tag>.png."""
    if not self.enabled:
      return
    grid = image_grid(images)
    self.writer.add_image(tag, grid, step, dataformats="HWC")
    Image.fromarray(grid.squeeze(-1) if grid.shape[-1] == 1 else grid).resize(
      (grid.shape[1] * 3, grid.shape[0] * 3), Image.NEAREST
    ).save(self.workdir / f"{tag}.png")

  def close(self) -> None:
    if self.writer:
      self.writer.close()
