"""Where a run's numbers go: the console, WORKDIR/metrics.jsonl and TensorBoard event files;
and the eval metrics a config adds, found by name.

An eval metric is `metric(logits, labels) -> [batch, ...]`, a value per example of any shape
(logits float32 [batch, classes] as the eval computes them, every view averaged; labels int32
[batch]), registered with `@research.metrics.register("name")` in a module of
`config.modules` and named in `config.eval_metrics`. The eval sums the values over the test
split, each example once (padding masked), on any device count and eval batch size; then
`finish(totals, count)` gives the reported value (`register(name, finish=f)`; default
`totals / count`, the mean over the examples, as accuracy is). The value may be an array
(`per_class_accuracy`, a confusion matrix): `eval_NAME` in every eval record (a list), the eval
line (a short summary), TensorBoard (a scalar a class, a histogram or an image) and
`./launch.sh eval`. Each metric's shape is checked before anything compiles (`shapes`).
"""

import inspect
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from research import workdir as workdir_lib
from research.errors import UserError
from research.fields import of_part
from research.registry import Registry

EVAL_METRICS = Registry("eval metric", "eval_metrics", "research.metrics")
register = EVAL_METRICS.register  # register(name, finish=f): f(totals, count) -> the value


@register("per_class_accuracy", finish=lambda totals, count: per_class(totals))
def per_class_accuracy(logits, labels):
  """Each class's accuracy over its test examples (NaN for a class the split lacks): a value
  per example [batch, 2, classes], its correct prediction and its class one-hot, summed over
  the split, then divided (`per_class`)."""
  label = jax.nn.one_hot(labels, logits.shape[-1])  # [batch, classes]
  correct = (logits.argmax(-1) == labels)[:, None] * label
  return jnp.stack([correct, label], 1)


def per_class(totals) -> np.ndarray:
  """[classes] accuracies from the totals [2, classes] of `per_class_accuracy`'s values."""
  with np.errstate(invalid="ignore", divide="ignore"):
    return totals[0] / totals[1]


def bound(name: str, source=None):
  """The eval metric `name` as `(logits, labels) -> [batch, ...]`: one that declared fields
  (`register(name, fields={...})`) is called with its view of `source` (the config) third."""
  metric, declared = EVAL_METRICS.get(name), bool(EVAL_METRICS.declared.get(name))
  args = ("logits", "labels", "fields") if declared else ("logits", "labels")
  try:
    inspect.signature(metric).bind(*args)
  except ValueError:  # no signature to read (a builtin): its call says
    pass
  except TypeError:
    raise UserError(
      f"eval metric {name!r} is called as metric({', '.join(args)}), "
      f"{'as it declares fields' if declared else 'as it declares no fields'}, which its "
      f"signature {inspect.signature(metric)} does not take (docs/extending.md)"
    ) from None
  if not declared:
    return metric
  view = of_part(EVAL_METRICS, name, {} if source is None else source)
  return lambda logits, labels: metric(logits, labels, view)


def shapes(names, num_classes: int, source=None) -> tuple:
  """((name, the shape of its value per example beyond the batch, the metric `bound` to
  `source`), ...) of the eval metrics `names`, traced (jax.eval_shape) on logits [batch,
  num_classes] and labels [batch] at two batch sizes other than the class count; a user error
  for a metric that does not return one value per example."""
  found = []
  for name in names:
    metric, outs = bound(name, source), []
    for batch in (num_classes + 1, num_classes + 2):
      logits = jax.ShapeDtypeStruct((batch, num_classes), jnp.float32)
      out = jax.eval_shape(metric, logits, jax.ShapeDtypeStruct((batch,), jnp.int32))
      shape = getattr(out, "shape", None)
      if shape is None or shape[:1] != (batch,) or (outs and shape[1:] != outs[0]):
        got = f"shape {shape}" if shape is not None else type(out).__name__
        raise UserError(
          f"eval metric {name!r} returns {got} for a batch of {batch} (logits [{batch}, "
          f"{num_classes}], labels [{batch}]); a metric returns a value per example, [batch, "
          "...]: the eval sums them over the split, and register(name, finish=f) turns the "
          "totals into a value over the whole split, as balanced accuracy needs "
          "(docs/extending.md)"
        )
      outs.append(shape[1:])
    found.append((name, outs[0], metric))
  return tuple(found)


def finish(name: str, totals, count):
  """The reported value of metric `name` from its `totals` over the split and the example
  `count` (several points: each point's, stacked)."""
  totals, count = np.asarray(totals, np.float64), np.asarray(count, np.float64)
  done = EVAL_METRICS.options[name].get("finish") or (lambda t, n: t / n)
  if count.ndim:
    each = zip(totals, count, strict=True)
    return np.stack([np.asarray(done(t, n), np.float64) for t, n in each])
  return np.asarray(done(totals, count), np.float64)


def plain(value):
  """A value as JSON holds it: a float, or (nested) lists of floats."""
  value = np.asarray(value, np.float64)
  return float(value) if not value.ndim else value.tolist()


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
RECORD_KEYS = (
  "step", "elapsed_sec", "eta_sec", "per_seed", "per_point", "best_point", "diverged",
  "dataset_used", "time",
)  # fmt: skip


def step_metrics(record: dict) -> list[str]:
  """The names of the metrics a fork's step adds to a train record, beyond TRAIN_SCALARS (and
  beyond the `NAME_std` that a record of several points adds for each)."""
  own = lambda k: k in TRAIN_SCALARS + RECORD_KEYS or k.startswith("learning_rate/")
  several = "per_seed" in record or "per_point" in record
  added = lambda k: several and k.endswith("_std") and k.removesuffix("_std") in record
  return [k for k in record if not own(k) and not added(k)]


def check_step_metrics(names, several: bool) -> None:
  """A user error for a metric of the step whose name a train record gives another value:
  one of the record's own fields, or (several points) NAME_std beside a metric NAME."""
  taken = set(TRAIN_SCALARS + RECORD_KEYS) - {"loss", "accuracy", "grad_norm", "param_norm"}
  clash = [n for n in names if n in taken or n.startswith("learning_rate/")]
  if several:
    clash += [n for n in names if n.endswith("_std") and n.removesuffix("_std") in names]
  if clash:
    raise UserError(
      f"the train step returns a metric {clash[0]!r}, a name the train records give "
      + ("the points' standard deviation" if clash[0].endswith("_std") else "their own field")
      + "; name it otherwise"
    )


def group_learning_rates(record: dict) -> list[str]:
  """The record's parameter groups' learning rates: `learning_rate/GROUP`."""
  return [k for k in record if k.startswith("learning_rate/")]


def duration(seconds: float) -> str:
  """`0:04:05`, or `11d 03:12:00` past a day."""
  minutes, sec = divmod(round(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  days, hours = divmod(hours, 24)
  return (f"{days}d " if days else "") + f"{hours}:{minutes:02d}:{sec:02d}"


def _finite_points(values) -> np.ndarray:
  """[points] bool: which points have every scalar value finite (`values`: arrays [points,
  ...]). An array metric's value is not asked: NaN there is a class the split lacks."""
  values = [np.asarray(v, np.float64) for v in values]
  scalars = [v for v in values if v.ndim == 1]
  if not scalars:
    return np.ones(len(values[0]) if values else 0, bool)
  return np.all([np.isfinite(v) for v in scalars], 0)


BEST = "by final eval accuracy, then eval cross-entropy"


def per_point(values: dict, columns: dict) -> dict:
  """A record of several points (research/sweep.py): each value's mean and standard deviation
  over them (`NAME`, `NAME_std`, n - 1 in the denominator; element by element for an array
  metric) and each point's values in the order of `columns` (sweep.columns). A run of seeds:
  over all of them, under `per_seed`. A sweep: over the points whose values are all finite (a
  diverged point's are left out), under `per_point`; an eval record's with `best_point`, the
  highest eval accuracy's, of those the lowest eval cross-entropy's (BEST)."""
  values = {name: np.asarray(v, np.float64) for name, v in values.items()}
  each = {name: v.tolist() for name, v in values.items()}
  live = _finite_points(list(values.values()))
  if "point" not in columns or not live.any():  # none finite: the means say so
    live = np.ones_like(live)
  added = {name: plain(np.mean(v[live], 0)) for name, v in values.items()}
  std = lambda v: plain(np.std(v, 0, ddof=1) if len(v) > 1 else np.zeros(v.shape[1:]))
  added |= {f"{name}_std": std(v[live]) for name, v in values.items()}
  if "point" not in columns:
    return added | {"per_seed": {**columns, **each}}
  added["per_point"] = {**columns, **each}
  if "eval_accuracy" in values:  # lexsort: the last key first
    order = np.lexsort((values["eval_loss"], -values["eval_accuracy"], ~live))
    added["best_point"] = columns["point"][int(order[0])]
  return added


def summary(value, digits: int = 4) -> str:
  """An array metric's value in a line: its values where there are at most 10, else its shape,
  mean, min and max (NaN, a class the split lacks, left out)."""
  value = np.asarray(value, np.float64)
  if value.size <= 10:
    return "[" + " ".join(f"{x:.{digits}f}" for x in value.ravel()) + "]"
  finite = value[np.isfinite(value)]
  if not finite.size:
    return f"[{'×'.join(map(str, value.shape))}: no finite values]"
  stats = (("mean", np.mean), ("min", np.min), ("max", np.max))
  stats = ", ".join(f"{k} {f(finite):.{digits}f}" for k, f in stats)
  return f"[{'×'.join(map(str, value.shape))}: {stats}]"


def _spread(record: dict, name: str, digits: int) -> str:
  """`0.1234`; `0.1234 ± 0.0056` for a record of several seeds; for a sweep's, the best point's
  value (an eval record's; a train record's: the points' mean) and the range over the points:
  `0.1234 [0.1100, 0.1300]`. An array metric: its `summary` (the best point's, the mean)."""
  value, std = record[name], record.get(f"{name}_std")
  if "per_point" in record:
    each = record["per_point"]
    if "best_point" in record:
      value = each[name][each["point"].index(record["best_point"])]
    if not isinstance(value, list):
      values = [v for v, live in zip(each[name], _live(each), strict=True) if live] or each[name]
      return f"{value:.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"
  if isinstance(value, list):
    return summary(value, digits)
  return f"{value:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def _live(each: dict) -> list[bool]:
  """Which points of a record's `per_point` have every value finite (not diverged)."""
  numbers = [v for k, v in each.items() if k not in ("point", "seed", "swept")]
  return _finite_points(numbers).tolist()


def _best(record: dict) -> str:
  """What a sweep's line says of its values (`_spread`), else ""."""
  if "per_point" not in record:
    return ""
  n = len(record["per_point"]["point"])
  if "best_point" not in record:
    return f"; the mean of the {n} points, [their range]"
  return f"; values of the best point ({record['best_point']} of {n}, {BEST}), [the points' range]"


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
    + _best(record)
  )


def eval_record(step: int, totals: dict, columns=None) -> dict:
  """The eval record of `totals` (steps.eval_sums summed over the test split). Its loss is
  cross-entropy whatever loss the run trains by (`config.loss`, its train records' `loss`).
  A registered metric's value is its `finish` of its totals (`finish`), a list for an array.
  Totals of several points (one value per point, named by `columns`, sweep.columns): their
  means, and each point's (`per_point`)."""
  count = np.asarray(totals["count"], np.float64)
  values = {
    "eval_loss": np.asarray(totals["loss_sum"]) / count,
    "eval_accuracy": np.asarray(totals["correct"]) / count,
  }
  if "correct_first_view" in totals:  # test-time augmentation: the plain accuracy too
    values["eval_accuracy_first_view"] = np.asarray(totals["correct_first_view"]) / count
  for name in eval_metric_names(totals):
    values[f"eval_{name}"] = finish(name, totals[f"metric/{name}"], count)
  record = {
    "step": step,
    "eval_loss": float(np.mean(values["eval_loss"])),
    "eval_loss_kind": "cross_entropy",
    "eval_accuracy": float(np.mean(values["eval_accuracy"])),
    "eval_examples": int(count.reshape(-1)[0]),  # every point counts the same examples
  }
  if "eval_accuracy_first_view" in values:
    record["eval_accuracy_first_view"] = float(np.mean(values["eval_accuracy_first_view"]))
  for name in eval_metric_names(totals):
    value = values[f"eval_{name}"]
    record[f"eval_{name}"] = plain(np.mean(value, 0) if count.ndim else value)
  if count.ndim:
    record.update(per_point(values, columns))
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
  of = f" of point {record['point']}" if "point" in record else ""  # `eval --point=`
  if views is not None:  # a sweep's: the best point's, and the range
    views = (
      _spread(record, "eval_accuracy_first_view", 4) if "per_point" in record else f"{views:.4f}"
    )
  return (
    f"eval{of} at step {record['step']}: loss = {_spread(record, 'eval_loss', 4)}, "
    f"accuracy = {_spread(record, 'eval_accuracy', 4)}"
    + (f" with test-time augmentation ({views} without)" if views is not None else "")
    + "".join(
      f", {k.removeprefix('eval_')} = {_spread(record, k, 4)}" for k in _added_eval_metrics(record)
    )
    + f" over {record['eval_examples']} examples"
    + (f" (each seed: {', '.join(f'{a:.4f}' for a in seeds)})" if seeds else "")
    + _best(record)
  )


def add_to(writer, tag: str, value, step: int) -> None:
  """`value` in TensorBoard as it reads: a scalar; an array of at most 32 values a scalar each
  (`TAG/i`, a class's); a longer vector a histogram; a matrix an image (scaled by its largest
  value: a confusion matrix). Values that are not finite are left out (TensorBoard only warns)."""
  value = np.asarray(value, np.float64)
  if value.ndim == 0 or (value.ndim == 1 and value.size <= 32):
    for i, x in enumerate(value.reshape(-1)):
      if np.isfinite(x):
        writer.add_scalar(tag if value.ndim == 0 else f"{tag}/{i}", float(x), step)
  elif value.ndim == 2:
    scaled = np.nan_to_num(value / max(np.nanmax(np.abs(value)), 1e-12))
    writer.add_image(tag, np.clip(scaled, 0, 1), step, dataformats="HW")
  elif np.isfinite(value).any():
    writer.add_histogram(tag, value[np.isfinite(value)], step)


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


def _step(line: str) -> float:
  """The step of a record's line (inf for one a kill cut short)."""
  try:
    return json.loads(line).get("step", 0)
  except json.JSONDecodeError:
    return float("inf")


class MetricsLog:
  """Prints records, appends them to metrics.jsonl and writes TensorBoard scalars/images.

  Only process 0 writes (`enabled`); `echo` prints a line (tqdm.write while a bar is shown).
  """

  def __init__(
    self, workdir: str, *, dataset_used: str, enabled: bool = True, echo=print, resumed_at=0
  ):
    self.workdir = Path(workdir)
    self.dataset_used = dataset_used
    self.enabled = enabled
    self.echo = echo
    self.writer = None
    self.point_writers = {}  # a sweep's: {label: the writer of its own run}
    if enabled:
      self._supersede(resumed_at)
      self.writer = self._writer(self.workdir / "tensorboard")

  def _supersede(self, resumed_at: int) -> None:
    """A run resumed at step `resumed_at`: the records of later steps (written before a kill,
    and trained again now) move to metrics_superseded.jsonl, so that metrics.jsonl reads as
    one run (as TensorBoard drops a resumed run's orphaned steps)."""
    path = self.workdir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    later = [not line.endswith("\n") or _step(line) > resumed_at for line in lines]  # or cut
    if not any(later):
      return
    with open(self.workdir / "metrics_superseded.jsonl", "a") as f:
      f.writelines(line for line, late in zip(lines, later, strict=True) if late)
    kept = self.workdir / "metrics.jsonl.partial"
    kept.write_text("".join(line for line, late in zip(lines, later, strict=True) if not late))
    kept.replace(path)  # whole or not at all

  @staticmethod
  def _writer(directory: Path):
    from tensorboardX import SummaryWriter  # imported only where it writes

    return SummaryWriter(str(directory), flush_secs=30)

  def _append(self, record: dict) -> None:
    record = {**record, "dataset_used": self.dataset_used, "time": time.time()}
    with open(self.workdir / "metrics.jsonl", "a") as f:
      f.write(json.dumps(record) + "\n")

  def train(self, record: dict) -> None:
    if not self.enabled:
      return
    self.echo(format_train_line(record))
    self._append(record)
    names = (*TRAIN_SCALARS, *step_metrics(record), *group_learning_rates(record))
    for name in names if "per_point" not in record else ():  # a sweep: each point's run
      add_to(self.writer, f"train/{name}", record[name], record["step"])
    self._per_seed("train", record)

  def eval(self, record: dict) -> None:
    if not self.enabled:
      return
    self.echo(format_eval_line(record))
    self._append(record)
    names = ("eval_loss", "eval_accuracy", *_added_eval_metrics(record))
    for name in names if "per_point" not in record else ():  # a sweep: each point's run
      add_to(self.writer, f"eval/{name.removeprefix('eval_')}", record[name], record["step"])
    self._per_seed("eval", record)
    for writer in (self.writer, *self.point_writers.values()):
      writer.flush()

  def _per_seed(self, group: str, record: dict) -> None:
    """Each point's values of a record of several: a run of seeds' tagged `GROUP/NAME/seed_N`;
    a sweep's point's as a single run's, in a TensorBoard run of its own
    (WORKDIR/tensorboard/LABEL), so that the points' curves overlay."""
    seeds, points = record.get("per_seed", {}), record.get("per_point", {})
    for name, values in seeds.items():
      if name == "seed":
        continue
      for seed, value in zip(seeds["seed"], values, strict=True):
        tag = f"{group}/{name.removeprefix('eval_')}/seed_{seed}"
        add_to(self.writer, tag, value, record["step"])
    names = [n for n in points if n in record]  # the metrics, not the columns
    live = _live(points) if points else []
    for i, label in enumerate(points.get("point", ())):
      if not live[i]:  # diverged: its NaN would only warn
        continue
      if label not in self.point_writers:
        self.point_writers[label] = self._writer(self.workdir / "tensorboard" / label)
      for name in names:
        tag = f"{group}/{name.removeprefix('eval_')}"
        add_to(self.point_writers[label], tag, points[name][i], record["step"])

  def sweep(self, final: dict, loss_fields=()) -> None:
    """A sweep's end: its points sorted by the final eval (`sweep_table`) and WORKDIR/sweep.png
    (`plot_sweep`, from metrics.jsonl's train records; `loss_fields`: what the loss reads)."""
    if not self.enabled:
      return
    self.echo(sweep_table(final))
    records = workdir_lib.records(self.workdir / "metrics.jsonl")
    plot_sweep(records, final, self.workdir / "sweep.png", loss_fields)
    self.echo(f"wrote {self.workdir / 'sweep.png'}: accuracy against the swept values, the losses")

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
    for writer in (self.writer, *self.point_writers.values()):
      if writer:
        writer.close()


def sweep_table(final: dict) -> str:
  """A sweep's points in order (BEST), the diverged ones last, and which point `eval`,
  `predict`, `trained.load` and `init_from` take by default."""
  each, diverged = final["per_point"], final.get("diverged", {})
  order = sorted(
    range(len(each["point"])),
    key=lambda i: (
      each["point"][i] in diverged,
      -np.nan_to_num(each["eval_accuracy"][i], nan=-1),
      np.nan_to_num(each["eval_loss"][i], nan=np.inf),
    ),
  )
  width = max(len(label) for label in each["point"])
  lines = [f"the sweep's {len(order)} points {BEST}:"]
  for rank, i in enumerate(order, 1):
    label = each["point"][i]
    said = f"accuracy {each['eval_accuracy'][i]:.4f}, cross-entropy {each['eval_loss'][i]:.4f}"
    if label in diverged:
      said = f"diverged by step {diverged[label]}"
    lines.append(f"  {rank:2d}. {label:{width}}  {said}")
  lines.append(
    f"best: {final['best_point']} ({BEST}; eval, predict, trained.load and init_from take it "
    "unless --point=LABEL, point=, init_from_point= names another)"
  )
  return "\n".join(lines)


def loss_title(swept, loss_fields) -> str:
  """The title of sweep.png's loss panel: where a swept field is one the loss reads, the points'
  losses are of different functions, and it says so."""
  title = "each point's training loss"
  if reshaped := [field for field in swept if field in loss_fields]:
    title += f"\n({', '.join(reshaped)} changes the loss itself: compare the accuracies)"
  return title


def plot_sweep(records: list[dict], final: dict, path: Path, loss_fields=()) -> None:
  """WORKDIR/sweep.png: the final eval accuracy against each swept field's values (a dot a
  point, a line through each value's mean over the seeds), and every point's training loss; a
  swept field among `loss_fields` (those the training loss reads) changes the loss itself, and
  the loss panel says so."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  each = final["per_point"]
  swept = each["swept"]
  fig, axes = plt.subplots(1, len(swept) + 1, figsize=(5.5 * (len(swept) + 1), 4.2), squeeze=False)
  accuracy = np.asarray(each["eval_accuracy"], np.float64)
  diverged = final.get("diverged", {})
  live = np.asarray([label not in diverged for label in each["point"]])
  for ax, (field, values) in zip(axes[0], swept.items(), strict=False):
    values = np.asarray(values, np.float64)
    ax.scatter(values[live], accuracy[live], color="tab:blue", alpha=0.6)
    if not live.all():
      ax.scatter(values[~live], accuracy[~live], color="tab:red", marker="x", label="diverged")
      ax.legend(fontsize=7)
    xs = sorted(set(values.tolist()))
    means = [np.mean(accuracy[live & (values == x)]) if (live & (values == x)).any() else np.nan
             for x in xs]  # fmt: skip
    ax.plot(xs, means, color="tab:blue")
    if min(xs) > 0 and max(xs) / min(xs) >= 10:
      ax.set_xscale("log")
      ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(xs, [f"{x:g}" for x in xs])  # the swept values themselves
    ax.set(xlabel=field, ylabel="final eval accuracy", title=f"accuracy against {field}")
    ax.grid(alpha=0.3)
  ax = axes[0][-1]
  curves = [r for r in records if r.get("per_point", {}).get("point") == each["point"]]
  curves = [r for r in curves if "loss" in r["per_point"]]  # train records
  for i, label in enumerate(each["point"]):
    said = f"{label} (diverged by step {diverged[label]})" if label in diverged else label
    ax.plot([r["step"] for r in curves], [r["per_point"]["loss"][i] for r in curves], label=said)
  ax.set(xlabel="step", ylabel="training loss", title=loss_title(swept, loss_fields))
  ax.set_yscale("log")
  numbers = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
  ax.yaxis.set_major_formatter(numbers)
  ax.yaxis.set_minor_formatter(numbers)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
