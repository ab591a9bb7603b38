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

from research import workdir as workdir_lib
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
RECORD_KEYS = (
  "step", "elapsed_sec", "eta_sec", "per_seed", "per_point", "best_point", "diverged",
  "dataset_used", "time",
)  # fmt: skip


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


def per_point(values: dict, columns: dict) -> dict:
  """A record of several points (research/sweep.py): each value's mean and standard deviation
  (`NAME`, `NAME_std`, n - 1 in the denominator) and each point's values in the order of
  `columns` (sweep.columns). A run of seeds: over all of them, under `per_seed`. A sweep: over
  the points whose values are all finite (a diverged point's are left out), under
  `per_point`, with `best_point`: the highest eval accuracy's (an eval record), else the
  lowest loss's."""
  values = {name: np.asarray(v, np.float64) for name, v in values.items()}
  each = {name: v.tolist() for name, v in values.items()}
  live = np.all([np.isfinite(v) for v in values.values()], 0)
  if "point" not in columns or not live.any():  # none finite: the means say so
    live = np.ones_like(live)
  added = {name: float(np.mean(v[live])) for name, v in values.items()}
  std = lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0
  added |= {f"{name}_std": std(v[live]) for name, v in values.items()}
  if "point" not in columns:
    return added | {"per_seed": {**columns, **each}}
  score = values["eval_accuracy"] if "eval_accuracy" in values else -values["loss"]
  best = int(np.argmax(np.where(live, score, -np.inf)))
  return added | {"per_point": {**columns, **each}, "best_point": columns["point"][best]}


def _spread(record: dict, name: str, digits: int) -> str:
  """`0.1234`; `0.1234 ± 0.0056` for a record of several seeds; for a sweep's, the best point's
  value and the range over the points: `0.1234 [0.1100, 0.1300]`."""
  std = record.get(f"{name}_std")
  if "per_point" in record:
    each = record["per_point"]
    values = [v for v, live in zip(each[name], _live(each), strict=True) if live] or each[name]
    best = each[name][each["point"].index(record["best_point"])]
    return f"{best:.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"
  return f"{record[name]:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def _live(each: dict) -> list[bool]:
  """Which points of a record's `per_point` have every value finite (not diverged)."""
  numbers = [v for k, v in each.items() if k not in ("point", "seed", "swept")]
  return np.all(np.isfinite(np.asarray(numbers, np.float64)), 0).tolist()


def _best(record: dict) -> str:
  """What a sweep's line says of its values (`_spread`), else ""."""
  if "per_point" not in record:
    return ""
  n = len(record["per_point"]["point"])
  return f"; values of the best point ({record['best_point']} of {n}), [the points' range]"


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
    values[f"eval_{name}"] = np.asarray(totals[f"metric/{name}"]) / count
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
    record[f"eval_{name}"] = float(np.mean(values[f"eval_{name}"]))
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
    self.point_writers = {}  # a sweep's: {label: the writer of its own run}
    if enabled:
      self.writer = self._writer(self.workdir / "tensorboard")

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
      self.writer.add_scalar(f"train/{name}", record[name], record["step"])
    self._per_seed("train", record)

  def eval(self, record: dict) -> None:
    if not self.enabled:
      return
    self.echo(format_eval_line(record))
    self._append(record)
    names = ("eval_loss", "eval_accuracy", *_added_eval_metrics(record))
    for name in names if "per_point" not in record else ():  # a sweep: each point's run
      self.writer.add_scalar(f"eval/{name.removeprefix('eval_')}", record[name], record["step"])
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
        self.writer.add_scalar(tag, value, record["step"])
    names = [n for n in points if n in record]  # the metrics, not the columns
    live = _live(points) if points else []
    for i, label in enumerate(points.get("point", ())):
      if not live[i]:  # diverged: its NaN would only warn
        continue
      if label not in self.point_writers:
        self.point_writers[label] = self._writer(self.workdir / "tensorboard" / label)
      for name in names:
        tag = f"{group}/{name.removeprefix('eval_')}"
        self.point_writers[label].add_scalar(tag, points[name][i], record["step"])

  def sweep(self, final: dict) -> None:
    """A sweep's end: its points sorted by the final eval (`sweep_table`) and WORKDIR/sweep.png
    (`plot_sweep`, from metrics.jsonl's train records)."""
    if not self.enabled:
      return
    self.echo(sweep_table(final))
    records = workdir_lib.records(self.workdir / "metrics.jsonl")
    plot_sweep(records, final, self.workdir / "sweep.png")
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
  """A sweep's points sorted by their final eval accuracy, the diverged ones last, and which
  point `eval`, `predict`, `trained.load` and `init_from` take by default."""
  each, diverged = final["per_point"], final.get("diverged", {})
  order = sorted(
    range(len(each["point"])),
    key=lambda i: (each["point"][i] in diverged, -np.nan_to_num(each["eval_accuracy"][i], nan=-1)),
  )
  width = max(len(label) for label in each["point"])
  lines = [f"the sweep's {len(order)} points by final eval accuracy:"]
  for rank, i in enumerate(order, 1):
    label = each["point"][i]
    said = f"accuracy {each['eval_accuracy'][i]:.4f}, loss {each['eval_loss'][i]:.4f}"
    if label in diverged:
      said = f"diverged by step {diverged[label]}"
    lines.append(f"  {rank:2d}. {label:{width}}  {said}")
  lines.append(
    f"best: {final['best_point']} (eval, predict, trained.load and init_from take it unless "
    "--point=LABEL, point=, init_from_point= names another)"
  )
  return "\n".join(lines)


def plot_sweep(records: list[dict], final: dict, path: Path) -> None:
  """WORKDIR/sweep.png: the final eval accuracy against each swept field's values (a dot a
  point, a line through each value's mean over the seeds), and every point's training loss."""
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
  ax.set(xlabel="step", ylabel="training loss", title="each point's training loss")
  ax.set_yscale("log")
  plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
  ax.yaxis.set_major_formatter(plain)
  ax.yaxis.set_minor_formatter(plain)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
