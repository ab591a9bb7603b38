"""A trained run, used again: loaded in Python, or its checkpoint evaluated again.

  ./launch.sh eval WORKDIR [--step=N] [--config.FIELD=VALUE ...]
  ./launch.sh predict WORKDIR PATH ... [--top_k=K] [--output=FILE.csv] [--step=N]

`eval` evaluates the newest checkpoint (or step N) with the run's own config and data, every
view of its eval preprocessing, and prints the training's eval line; with no override it
reproduces the final eval record. `data_dir` (another folder of the same classes),
`eval_preprocess` and `eval_batch_size` may be overridden. Each eval's record, with what was
overridden, is appended to WORKDIR/evals.jsonl (a workdir it cannot write in: a warning line,
and the exit status is still 0); nothing the training reads is touched. Neither command takes
the workdir's lock: both read only finished checkpoints, and an unreadable newest one is
passed over with a warning line (with --step=N, an error line naming the readable steps).

`predict` reads image files (a PATH that is a folder: every image under it), brings each to
the size the run trained on as its data path does (resident data: shorter side resized,
center cropped; streamed: longer side resized, padded), and writes for each its top K classes
and their probabilities: a CSV (`path`, `class`, `probability`, `class_2`, ...) or a table.
A file that does not decode is named and skipped.

`load(WORKDIR)` gives the run's config, class names, variables and model, and
`predict(images_u8)`: class probabilities, through the run's eval preprocessing.

A run of several seeds (`config.seeds`) is evaluated seed by seed; `predict` and `load` take
one seed (`--seed=N`, `seed=N`) or, by default, the ensemble of all: the mean of their
probabilities. A fine-tune (`init_from`) starts from one seed's weights (`init_from_seed`).
"""

import argparse
import csv
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from research import augment as augment_lib
from research import checkpoint, configuration, environment, models, steps, validate
from research import data as data_lib
from research import fields as fields_lib
from research import inputs as inputs_lib
from research import sweep as sweep_lib
from research import workdir as workdir_lib
from research.data import folder
from research.errors import EXIT_USER_ERROR, UserError, exit_interrupted
from research.metrics import eval_record, format_eval_line
from research.placement import replicate
from research.steps import AXIS

EVALS = "evals.jsonl"  # one record per `eval`, in the workdir
EVAL_FIELDS = ("data_dir", "eval_preprocess", "eval_batch_size")  # what `eval` may change


@flax.struct.dataclass
class Weights:
  """What the eval takes of a train state."""

  params: Any
  batch_stats: Any
  apply_fn: Callable = flax.struct.field(pytree_node=False)


@dataclasses.dataclass
class Trained:
  """A run's checkpoint, ready to use (`load`)."""

  config: ml_collections.ConfigDict  # as the run resolved it (WORKDIR/config.json)
  classes: tuple[str, ...]  # class names, in label order
  variables: dict  # {"params": ..., "batch_stats": ...}
  model: nn.Module
  step: int  # the checkpoint's
  # The seeds whose variables are stacked along a leading axis, predicting as their ensemble
  # (the mean of their probabilities); () for one seed's variables
  seeds: tuple = ()
  # [H, W, C] of the run's stored examples: files are read at that size, C = 1 as grayscale
  example_shape: tuple = ()

  def predict(self, images, sizes=None) -> np.ndarray:
    """Class probabilities [N, num_classes] of `images`: image files or PIL images (a list),
    read and resized as `./launch.sh predict` reads them (the same probabilities); or uint8
    [N, H, W, C] of the size the run trained on, `sizes` [N, 2] the valid part of padded
    images for a run on streamed data. Through the run's eval preprocessing (every view)."""
    if isinstance(images, (list, tuple)):
      examples = [self.example(image) for image in images]
      return _on_all_devices(self, examples, self.config.eval_batch_size, self.streamed)
    images_u8 = jnp.asarray(images, jnp.uint8)
    if self.example_shape and images_u8.shape[1:] != tuple(self.example_shape):
      raise UserError(
        f"predict: arrays of shape {images_u8.shape}, where the run's examples are "
        f"[N, {', '.join(map(str, self.example_shape))}]: resize them, or give image files "
        "(resized as ./launch.sh predict reads them)"
      )
    return np.asarray(self._jitted_probabilities(self.variables, images_u8, sizes))

  def example(self, image) -> dict:
    """{"image": uint8 [size, size, C]} (and "size", its valid part, for a run on streamed
    data) of an image file or a PIL image, as the run's examples are stored: its shorter side
    resized to the run's size and its centre cropped; streamed, its longer side resized and
    the rest padded. A run on one channel reads it as grayscale (PIL's luma)."""
    size, _, channels = self.example_shape or (data_lib.stored_size(self.config), None, 3)
    if channels not in (1, 3):
      raise UserError(
        f"the run's examples have {channels} channels; image files give 1 (gray) or 3 (RGB): "
        "give predict arrays of the run's shape instead"
      )
    if self.streamed:
      return folder.pad_to_square(folder.read_rgb(image, max_side=size), size)
    rgb = folder.read_rgb(image, cover=size)
    return {"image": rgb if channels == 3 else folder.gray(rgb)}

  @functools.cached_property
  def preprocess(self) -> Callable:
    """The run's eval preprocessing (research/augment.py), built once."""
    return augment_lib.build(self.config.eval_preprocess, self.config.seed)

  @property
  def streamed(self) -> bool:  # the eval takes each image's valid part (a streamed run)
    return self.preprocess.windowed

  @functools.cached_property
  def _jitted_probabilities(self) -> Callable:  # one jit: a second call of a shape reuses it
    return jax.jit(self.probabilities)

  def probabilities(self, variables, images_u8, sizes=None):
    """`predict` as a function of the variables, to jit or pmap."""

    def one(variables):
      weights = Weights(variables["params"], variables["batch_stats"], models.apply_fn(self.model))
      logits, _ = steps.eval_logits(weights, images_u8, sizes, preprocess=self.preprocess)
      return jax.nn.softmax(logits)

    return jax.vmap(one)(variables).mean(0) if self.seeds else one(variables)


def run_classes(workdir: Path, num_classes: int) -> tuple[str, ...]:
  """The class names the run's last launch recorded (numbers for runs before they were)."""
  classes = workdir_lib.last_recorded(workdir, "classes")
  return tuple(classes or (str(label) for label in range(num_classes)))


def load(
  workdir, step: int | None = None, seed: int | None = None, point: str | None = None
) -> Trained:
  """The run in `workdir` at its newest checkpoint (or `step`'s). A run of several seeds:
  `seed`'s weights, or (None) the ensemble of all its seeds. A sweep: `point`'s weights (a
  label as the run printed it, a part of one, or an index: `sweep.chosen_point`), by default its
  best point's."""
  workdir = Path(workdir)
  config = configuration.run_config(workdir)
  step, state = checkpoint.read(workdir, step)
  variables = {"params": checkpoint.used_params(state), "batch_stats": state.get("batch_stats", {})}
  runs = sweep_lib.runs_of(config)
  seeds = sweep_lib.run_seeds(runs)
  index = sweep_lib.chosen_point(workdir, runs, seed, point, str(workdir))
  if index is not None:  # one point's weights, and its single run's config
    variables, seeds = sweep_lib.one_point(variables, index), ()
    config = sweep_lib.point_config(config, runs.points[index])
  model = models.create(config.model, None)
  shape = tuple(workdir_lib.last_recorded(workdir, "example_shape") or ())  # runs before: RGB
  classes = run_classes(workdir, config.model.num_classes)
  return Trained(config, classes, variables, model, step, seeds, shape)


def evaluate(workdir, step: int | None = None, overrides=(), point: str | None = None) -> dict:
  """Evaluates the run in `workdir` (its newest checkpoint, or `step`'s) with `overrides`
  [(field, text)] of EVAL_FIELDS; prints the eval line, appends the record to evals.jsonl. A
  run of several points: each of them, or the one `point` names (`sweep.chosen_point`)."""
  workdir = Path(workdir)
  config = configuration.run_config(workdir)
  for field, value in overrides:
    if field not in EVAL_FIELDS:
      raise UserError(
        f"eval does not change {field}; it takes --config.FIELD=VALUE for {', '.join(EVAL_FIELDS)}"
      )
    configuration.override(config, field, value)
  checked = validate.train_config(config, jax.device_count())
  runs = sweep_lib.runs_of(config)
  index = (
    sweep_lib.chosen_point(workdir, runs, None, point, str(workdir)) if point is not None else None
  )
  step, state = checkpoint.read(workdir, step)  # before any data is loaded
  recorded = workdir_lib.last_recorded(workdir, "classes")  # runs before it: not recorded
  train = Path(config.data_dir) / "train"
  if config.dataset == "folder" and recorded and train.is_dir():  # listed, not yet decoded
    _check_classes(config.data_dir, folder.class_dirs(train), recorded)
  variables = {"params": checkpoint.used_params(state), "batch_stats": state.get("batch_stats", {})}
  one = config  # one point's eval: its single run's (no point axis, no columns)
  if index is not None:
    one = sweep_lib.point_config(config, runs.points[index])
    variables = sweep_lib.one_point(variables, index)
  fields = fields_lib.for_module(one, inputs_lib)  # other datasets' classes: from its config
  inputs = inputs_lib.for_run(fields, checked, sweep_lib.runs_of(one))
  model = models.create(config.model, AXIS)
  columns = sweep_lib.columns(one)
  weights = Weights(variables["params"], variables["batch_stats"], models.apply_fn(model))
  start = time.perf_counter()
  record = eval_record(step, inputs.evaluate(replicate(weights), True), columns)
  if index is not None:
    record["point"] = runs.labels[index]
  record["eval_weights"] = "ema" if state.get("ema_params") is not None else "params"
  record.update(eval_sec=time.perf_counter() - start, time=time.time())
  record["overrides"] = dict(overrides)
  print(format_eval_line(record), flush=True)
  if jax.process_index() == 0:
    _append(workdir / EVALS, record)
  return record


def _append(path: Path, record: dict) -> None:
  """`record` as the last line of `path`; where it cannot be written (a read-only workdir), one
  warning line: the eval line above is the result, and `eval` still exits 0."""
  try:
    with open(path, "a") as f:
      f.write(json.dumps(record) + "\n")
  except OSError as e:
    print(f"warning: the record was not appended to {path} ({e.strerror or e})", file=sys.stderr)


def predict(
  workdir,
  paths,
  top_k: int = 1,
  output=None,
  step: int | None = None,
  seed: int | None = None,
  point: str | None = None,
) -> list[dict]:
  """Each readable image under `paths`: {"path", "classes": top_k names, "probabilities"};
  written to `output` (a CSV) or printed as a table. A run of several points: those of the
  one `seed` and `point` name (`sweep.chosen_point`); by default a sweep's best point's, a run of
  seeds' ensemble's."""
  model = load(Path(workdir), step, seed, point)
  if not 1 <= top_k <= len(model.classes):
    raise UserError(f"--top_k={top_k}: choose 1 to {len(model.classes)} (the run's classes)")
  files = _image_files(paths)
  decoded = []
  for path in files:
    try:
      decoded.append((path, model.example(str(path))))
    except folder.DECODE_ERRORS as e:
      print(f"skipped {path}: not an image PIL can decode ({type(e).__name__})", file=sys.stderr)
  if not decoded:
    raise UserError(f"no image under {', '.join(map(str, paths))} could be decoded")
  examples = [d for _, d in decoded]
  probabilities = _on_all_devices(model, examples, model.config.eval_batch_size, model.streamed)
  rows = []
  for (path, _), p in zip(decoded, probabilities, strict=True):
    best = np.argsort(-p, kind="stable")[:top_k]
    rows.append(
      {"path": str(path), "classes": [model.classes[i] for i in best], "probabilities": p[best]}
    )
  _write(rows, top_k, output)
  return rows


def _image_files(paths) -> list[Path]:
  """The files named, and the images under the folders named (as an image folder's split)."""
  files = []
  for path in map(Path, paths):
    if path.is_dir():
      files += [path / f for f in folder.files_under(path)[0]]
    elif path.is_file():
      files.append(path)
    else:
      raise UserError(f"{path} does not exist; give image files or folders of them")
  if not files:
    raise UserError(f"no image files under {', '.join(map(str, paths))}")
  return files


def _on_all_devices(model: Trained, examples: list[dict], batch: int, padded: bool):
  """Probabilities [N, classes] of the examples, `batch` at a time split over the devices;
  `padded`: the examples carry the valid size of their padded images (streamed data)."""
  n_devices = jax.local_device_count()
  per_device = max(1, batch // n_devices)
  fn = model.probabilities if padded else lambda v, x, _: model.probabilities(v, x)
  p_probabilities = jax.pmap(fn, in_axes=(None, 0, 0))
  images = np.stack([e["image"] for e in examples])
  whole = np.asarray(images.shape[1:3], np.int32)
  sizes = np.stack([e.get("size", whole) for e in examples])
  out = []
  for start in range(0, len(images), per_device * n_devices):
    chunk = slice(start, start + per_device * n_devices)
    part, part_sizes, n = images[chunk], sizes[chunk], len(images[chunk])
    pad = -n % n_devices  # a last chunk shorter than the devices: padded, then dropped
    part = np.concatenate([part, np.repeat(part[-1:], pad, 0)])
    part_sizes = np.concatenate([part_sizes, np.repeat(part_sizes[-1:], pad, 0)])
    split = lambda x: x.reshape(n_devices, -1, *x.shape[1:])  # [devices, per_device, ...]
    result = p_probabilities(model.variables, split(part), split(part_sizes))
    out.append(np.asarray(result).reshape(-1, result.shape[-1])[:n])
  return np.concatenate(out)


def _write(rows: list[dict], top_k: int, output) -> None:
  header = ["path", "class", "probability"]
  header += [f"{name}_{k}" for k in range(2, top_k + 1) for name in ("class", "probability")]
  pairs = lambda row: zip(row["classes"], row["probabilities"], strict=True)
  table = [[row["path"], *(v for pair in pairs(row) for v in pair)] for row in rows]
  if output:  # written whole or not at all: a Ctrl-C leaves an earlier file as it was
    partial = Path(f"{output}.partial")
    try:
      with open(partial, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([[c if isinstance(c, str) else f"{c:.6f}" for c in r] for r in table])
      partial.replace(output)
    finally:
      partial.unlink(missing_ok=True)
    print(f"wrote {len(rows)} predictions to {output}")
    return
  text = [[c if isinstance(c, str) else f"{c:.4f}" for c in r] for r in table]
  widths = [max(len(r[i]) for r in [header, *text]) for i in range(len(header))]
  for r in [header, *text]:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _check_classes(data: str, found, trained_on) -> None:
  if tuple(found) != tuple(trained_on):
    differ = sorted(set(found) ^ set(trained_on))[:5] or ["their order"]
    raise UserError(
      f"{data} has {len(found)} classes where the run was trained on {len(trained_on)}, and they "
      f"differ in {', '.join(differ)}; evaluate on data of the same classes"
    )


def parse_args(argv: list[str]):
  """(the command, its arguments, the --config.FIELD=VALUE overrides)."""
  command = argv[0] if argv else ""
  if command not in ("eval", "predict"):
    raise UserError("say what to do with the run: eval WORKDIR, or predict WORKDIR PATH ...")
  parser = argparse.ArgumentParser(
    prog=f"launch.sh {command}", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("workdir", help="a training run's --workdir")
  if command == "predict":
    parser.add_argument("paths", nargs="+", help="image files, or folders of them")
    parser.add_argument("--top_k", type=int, default=1, help="classes per image")
    parser.add_argument("--output", default="", help="a CSV file (default: a table)")
  parser.add_argument("--step", type=int, default=None, help="default: the newest checkpoint")
  parser.add_argument(
    "--point",
    default=None,
    help="a run of several points: this one's weights, its label as the run printed it "
    "(learning_rate=0.03), a part of it, or its index (default: eval: every point; predict: "
    "a sweep's best point, a run of seeds' ensemble)",
  )
  if command == "predict":
    parser.add_argument(
      "--seed",
      type=int,
      default=None,
      help="a run of several seeds: this seed's weights (default: the ensemble of all)",
    )
  args, rest = parser.parse_known_args(argv[1:])
  args.command = command
  return args, configuration.overrides(rest)


def main(argv: list[str]) -> int:
  try:
    environment.check(environment.CORE)
    args, overrides = parse_args(argv)
    workdir = Path(args.workdir).expanduser()
    if args.command == "eval":
      evaluate(workdir, args.step, overrides, args.point)
    elif overrides:
      raise UserError("predict uses the run's config as it is; it takes no --config.FIELD")
    else:
      predict(workdir, args.paths, args.top_k, args.output, args.step, args.seed, args.point)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USER_ERROR
  except KeyboardInterrupt:
    command = argv[0] if argv else "the command"
    exit_interrupted(f"\n{command} interrupted (Ctrl-C); nothing more was written")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
