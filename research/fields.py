"""The config's fields: the library's own, with their defaults and units (`library`, where
every training config starts), which of them each kind of part reads (`KINDS`), and the
read-only view of them a part is given (`View`).

Every field has an owner. The library owns those of `library()`; a registered part owns the
fields it declares, `register(name, fields={"warmup_steps": 0})`, which a run naming that
part adds to its config with their defaults (research/configuration.py `complete`). A part
is handed its kind's fields and its own, never the whole config: a loss reads
`label_smoothing` and what it declared, and reading any other field is one `error:` line
naming the part and the field.
"""

import difflib

import ml_collections

from research.errors import UserError


def library() -> ml_collections.ConfigDict:
  """The library's own fields, each with its default and unit: every training config starts
  from these (configs/common.py's training_defaults), and a part's declared fields join them."""
  c = ml_collections.ConfigDict()
  for add in (_runs, _data, _steps, _optimizer, _records):
    add(c)
  return c


def _runs(c) -> None:
  """What a run is: its experiment, the modules of a fork's parts, its seeds and sweep."""
  c.experiment = "train"  # research.train; standalone experiments name their module instead
  # Python modules (importable from the repository root or the PYTHONPATH) imported before
  # the config is checked: a fork's models, losses, augmentation ops, datasets and optimizers
  # register themselves there (docs/extending.md). A run records them; its eval imports them.
  c.modules = ()
  c.seed = 0  # parameters, data order and augmentation: functions of (seed, step, device count)
  # Seeds trained at once, in one program: seed, seed + 1, ..., each as its single run would
  # train, their results reported one by one and as mean ± std (docs/sweeps.md)
  c.seeds = 1
  # Float fields swept in one program, each point (times each seed) trained as its single run
  # would: "FIELD=V1,V2,...", fields apart by ";" for their grid, e.g.
  # "learning_rate=0.01,0.03,0.1;weight_decay=0,5e-4" or "param_groups.filters.momentum=0.8,0.9"
  # (docs/sweeps.md); "" = one run
  c.sweep = ""
  # How a step runs its points (seeds, a sweep's): "unroll", each point's step traced apart in
  # the one program (the single step's kernels; a compile that grows with the points); "vmap",
  # one batched computation (batched convolutions, slower on the CPU and the GPU measured)
  c.seeds_mode = "unroll"


def _data(c) -> None:
  """The data: which, from where, and how it reaches the devices."""
  c.dataset = "cifar10"  # registered (research/data), or "folder", "imagenet2012", "imagenette"
  c.data_dir = ""  # cifar10: archive / batches dir / TFDS dir ("" = cache); folder: its root
  c.data_fallback = True  # no data and no network: train on synthetic data (said loudly)
  c.synthetic_train_size = 50_000  # examples, for dataset="synthetic"
  c.synthetic_test_size = 10_000
  c.synthetic_image_size = 32  # pixels per side
  c.synthetic_noise = 0.6  # per-pixel noise std, in units of the [0, 1] pixel range
  # Image folders (dataset="folder", research/data/folder.py) and streamed datasets.
  c.data_placement = "auto"  # folder: "resident" (on the devices), "streamed", or "auto":
  c.resident_max_gb = 4.0  # ... resident when the decoded train split is at most this size
  # Resident data: every device holds the whole training split when it is at most this size,
  # and every step's global batch is then the same on any device count; a larger split is
  # sharded over the devices, and its batches depend on the device count (docs/long_runs.md).
  c.replicate_max_gb = 2.0
  c.skip_bad_images = False  # True: skip undecodable files (counted in metadata.jsonl)
  # Image folders' pixels per side: resident, every image is brought to this square (shorter
  # side resized, center cropped; one of this size is kept as it is); streamed, its longer
  # side is resized to this (aspect kept, edge-padded to the square).
  c.host_image_size = 32
  c.data_workers = 2  # streamed: host decode processes (grain); 0 = in the training process
  c.prefetch = 2  # streamed: batches in flight to the devices while a step runs
  # CPU: keep the memory a step frees for the next step instead of giving it back to the
  # system (research/host_memory.py); False where a step's buffers approach the host's memory,
  # and for compile-bound runs (its one malloc arena serializes XLA's compiling threads).
  c.keep_freed_host_memory = True
  # Run the compiled step (on a copy of the state, which it needs room for) and the final eval
  # once before the clock starts, their results discarded, so that the timed steps run warm
  # (GPU kernels loaded, memory pools grown), as airbench times its runs after a warm-up run.
  c.warm_up = False


def _steps(c) -> None:
  """The batches, the run's length, the augmentation and the step."""
  # Batches and length. batch_size is GLOBAL: split evenly over all devices.
  c.batch_size = 256
  c.eval_batch_size = 1000  # global; the test split is padded and masked, never truncated
  c.num_epochs = 1
  c.num_train_steps = -1  # -1: num_epochs decides; >= 1 overrides num_epochs
  c.micro_batch_size = 0  # examples per forward/backward pass; 0 = auto (steps.micro_batch_size)
  # Steps one call of the compiled program runs on the device (a lax.scan, their metrics kept
  # there): > 1 for resident data only; it divides an epoch's steps, the run's, and the log,
  # eval, checkpoint and profile steps
  c.steps_per_call = 1

  # Augmentation, run on device: op names from research/augment.py joined by "|".
  c.augment = "crop(4)|flip_lr|standardize"
  c.eval_preprocess = "standardize"  # deterministic ops only

  # The train step, registered (research/steps.py): "standard", or a fork's (docs/extending.md)
  c.step = "standard"
  # BatchNorm's statistics in training: "global", over the global batch on any device count
  # (every BatchNorm is pointed at the step's axis, one written for one device too);
  # "per_device", each device's own examples (ghost BatchNorm): results then depend on the
  # device count, and the running statistics are averaged over the devices after each step
  c.batch_norm_statistics = "global"


def _optimizer(c) -> None:
  """The optimizer (optax), its schedule, the loss and fine-tuning."""
  c.optimizer = "sgd"  # registered (research/optim.py): "sgd", "adam", "rmsprop", "muon", ...
  c.learning_rate = 0.1  # peak, at the global batch lr_batch_size
  c.lr_batch_size = 256  # lr scales linearly with batch_size / lr_batch_size; 0 = no scaling
  # Registered (research/schedules.py): "cosine", "linear" (to zero), "constant", "inverse_time",
  # "exponential", or a fork's; each told the run's length, however it is set
  c.schedule = "cosine"
  c.warmup_epochs = 0.0
  c.lr_decay = 0.0  # inverse_time: lr / (1 + lr_decay * step), Keras' legacy `decay`
  c.lr_decay_rate = 0.94  # exponential: multiply by this every lr_decay_epochs (staircase)
  c.lr_decay_epochs = 2.0
  c.momentum = 0.9  # sgd momentum; rmsprop momentum
  c.nesterov = True
  c.rms_decay = 0.9  # rmsprop: decay of the squared-gradient average
  c.rms_eps = 1e-7
  c.rms_eps_in_sqrt = False  # False as Keras 2 (g / (sqrt(v) + eps)); True as TF's RMSProp
  c.weight_decay = 0.0  # L2 on conv/dense kernels only, added to the gradient
  c.grad_clip_norm = 0.0  # clip the global gradient norm; 0 = off
  # An exponential moving average of the weights, updated once a step (ema = decay · ema +
  # (1 - decay) · params), which evals, predict, trained.load and init_from then use; 0 = off
  c.ema_decay = 0.0
  c.loss = "cross_entropy"  # registered (research/losses.py); the eval reports cross-entropy
  c.label_smoothing = 0.0
  c.loss_reduction = "mean"  # over the global batch; "sum": the mean times the global batch
  # Groups of parameters with their own optimizer, lr, weight decay, schedule length, or
  # "frozen": {name: dict(match=REGEX, ...)}, fields in research/optim.py. Empty: one group.
  c.param_groups = ml_collections.ConfigDict()
  c.aux_loss_weight = 0.4  # loss="auxiliary_cross_entropy": the auxiliary head's weight
  # Fine-tuning: a new run starts from the weights of a run's workdir (its newest checkpoint,
  # or init_from_step's) or of one of its checkpoints (WORKDIR/checkpoints/STEP), matched by
  # parameter path; what differs in shape or is absent there starts afresh. "" = from scratch.
  c.init_from = ""
  c.init_from_step = 0  # 0: the newest
  c.init_from_seed = -1  # a run of several seeds (seeds > 1): the seed to start from
  c.init_from_point = ""  # a sweep: its point's label to start from ("" = its best point)


def _records(c) -> None:
  """Logging, evals, checkpoints and profiles."""
  # Eval metrics besides loss and accuracy, registered (research/metrics.py): a fork's, e.g.
  # ("top5",); each is `eval_NAME` in every eval record
  c.eval_metrics = ()
  c.log_every_steps = 50  # one device→host transfer of metrics per this many steps
  c.log_every_seconds = 60.0  # ... or sooner, once this long has passed (slow steps)
  # Evals and checkpoints: every this many epochs (a batch-size change keeps the schedule),
  # or every this many steps where *_every_steps > 0 (it overrides the epochs, as
  # num_train_steps does num_epochs); 0 and 0 = at the end only (an eval is always written).
  c.eval_every_epochs = 0.0
  c.eval_every_steps = 0
  c.checkpoint_every_epochs = 5.0
  c.checkpoint_every_steps = 0
  c.checkpoint_every_minutes = 10.0  # also once this long passed since the last (0 = off)
  c.lost_process_after_sec = 30  # several processes: a silent one is lost after this long
  c.keep_checkpoints = 3
  c.scaling_report = False  # run 1, 2, 4, … N devices instead (the tool tools/scaling.py)
  c.scaling_steps = 60  # steps per device count in the scaling report
  c.scaling_strong = False  # also fixed-global-batch (strong) scaling, besides weak scaling
  c.profile_steps = ()  # (start, stop): a jax.profiler trace of these steps in WORKDIR/profile


# model.dtype's values (and a model's param_dtype's): float64, with JAX's 64-bit types on, is
# for the suite's equivalence checks (docs/testing.md)
DTYPES = ("float32", "bfloat16", "float16", "float64")
# The library's fields each kind of part reads, besides the fields it declares. A model reads
# its sub-config (config.model): its `name`, `num_classes`, `dtype` and its own fields.
KINDS = {
  "model": ("name", "num_classes", "dtype"),
  "loss": ("loss", "label_smoothing", "aux_loss_weight", "loss_reduction", "batch_size"),
  "dataset": (
    "dataset", "data_dir", "seed", "data_fallback", "synthetic_train_size", "synthetic_test_size",
    "synthetic_image_size", "synthetic_noise", "host_image_size", "skip_bad_images",
    "model.num_classes",
  ),
  "optimizer": (
    "optimizer", "learning_rate", "momentum", "nesterov", "rms_decay", "rms_eps",
    "rms_eps_in_sqrt", "weight_decay",
  ),
  "schedule": (
    "schedule", "learning_rate", "warmup_epochs", "lr_decay", "lr_decay_rate", "lr_decay_epochs",
  ),
  "train step": (
    "step", "ema_decay", "batch_size", "loss_reduction", "micro_batch_size", "seed",
    "learning_rate", "label_smoothing", "batch_norm_statistics",
  ),
  "eval metric": (),
}  # fmt: skip
# What a parameter group sets besides its optimizer's and schedule's fields, and the defaults
# of those it may leave unset (`match` it must set).
GROUP = ("match", "train_fraction")
GROUP_DEFAULTS = {"train_fraction": 1.0}  # the whole run
REGISTERED = []  # each Registry's {part: {field it declares: its default}} (research/registry.py)
_LIBRARY = frozenset([*library(), "model", *GROUP])  # names View.get never answers with a default


class FieldError(UserError):
  """A part read a field outside its view: a field of the library's or of a registered part,
  by `view.get(name, default)`, `getattr(view, name, default)` and `hasattr` too (a default
  never stands in for the config's value)."""


class NoField(FieldError, AttributeError):
  """A part read a name that is no field at all: an AttributeError too, so that
  `getattr(view, name, default)` and `hasattr` behave as on any object."""


def is_field(name: str) -> bool:
  """Whether `name` is a config field: the library's (a model's kind's among them), or one a
  registered part declares."""
  declared = (d for fields in REGISTERED for d in fields.values())
  return name in _LIBRARY or name in KINDS["model"] or any(name in d for d in declared)


class View:
  """A part's read-only view of the config: `view.name`, `view["name"]`, `name in view`,
  `view.get(name, default)`, `view.to_dict()`. It holds the fields of the part's kind and those
  it declared; reading another is a FieldError that names the part, the field and how to
  declare it. A sub-config (`model`) is a View of its own."""

  def __init__(
    self, values: dict, part: str, kind_fields=(), declared=(), register: str = "", prefix=""
  ):
    object.__setattr__(self, "_values", dict(values))
    object.__setattr__(self, "_part", part)  # "schedule 'warmup_cosine'": in messages
    object.__setattr__(self, "_kind_fields", tuple(kind_fields))
    object.__setattr__(self, "_declared", tuple(declared))
    object.__setattr__(self, "_register", register)  # "schedules.register('warmup_cosine'"
    object.__setattr__(self, "_prefix", prefix)  # "model.", "param_groups.filters.", ""

  def __getattr__(self, name: str):
    if name.startswith("__"):  # copy, pickle and friends ask for these: plain AttributeError
      raise AttributeError(name)
    return self[name]

  def __getitem__(self, name: str):
    values = object.__getattribute__(self, "_values")
    if name in values:
      return values[name]
    raise (FieldError if is_field(name) else NoField)(self._outside(name))

  def _outside(self, name: str) -> str:
    kind = ", ".join(self._kind_fields) or "none"
    declared = ", ".join(self._declared) or "none"
    how = f"{self._register}, fields={{{name!r}: DEFAULT}})" if self._register else "fields="
    return (
      f"{self._part} reads the field {name!r}, which is neither its kind's ({kind}) nor one it "
      f"declares ({declared}); declare it with its default: {how} (docs/extending.md)"
    )

  def __setattr__(self, name, value):
    raise FieldError(f"{self._part} sets the field {name!r}; a part's fields are read-only")

  __setitem__ = __setattr__

  def __contains__(self, name) -> bool:
    return name in self._values

  def __iter__(self):
    return iter(self._values)

  def __len__(self) -> int:
    return len(self._values)

  def get(self, name: str, default=None):
    """The field's value; `default` for a field the config does not have at all. A field the
    config holds outside this view is a FieldError, as reading it otherwise is."""
    if name in self._values or not is_field(name):
      return self._values.get(name, default)
    raise FieldError(self._outside(name))

  def name_of(self, field: str) -> str:
    """`field` as the config file and the command line spell it: "model.width",
    "param_groups.filters.ns_steps", "label_smoothing"."""
    return self._prefix + field

  def keys(self):
    return self._values.keys()

  def items(self):
    return self._values.items()

  def values(self):
    return self._values.values()

  def to_dict(self) -> dict:
    plain = lambda v: v.to_dict() if isinstance(v, (View, ml_collections.ConfigDict)) else v
    return {k: plain(v) for k, v in self._values.items()}

  def with_values(self, values: dict) -> "View":
    """This view with the fields named in `values` ({field path: value}: a sweep's traced
    values, `param_groups.GROUP.FIELD` into a group) set; paths it does not hold are left."""
    mine = dict(self._values)
    for path, value in values.items():
      name, _, rest = path.partition(".")
      if name not in mine:
        continue
      if not rest:
        mine[name] = value
      elif isinstance(mine[name], View):
        mine[name] = mine[name].with_values({rest: value})
      elif isinstance(mine[name], ml_collections.ConfigDict):  # a dict takes a traced value
        mine[name] = with_values(mine[name], {rest: value})
    return View(mine, self._part, self._kind_fields, self._declared, self._register, self._prefix)

  def __repr__(self) -> str:
    return f"View({self._part}: {self._values!r})"


def with_values(source: ml_collections.ConfigDict, values: dict) -> ml_collections.ConfigDict:
  """A copy of `source` (a config, a group's fields) whose fields at the paths of `values`
  ({dotted path: value}) hold those values."""
  tree = source.to_dict()
  for path, value in values.items():
    *parents, name = path.split(".")
    node = tree
    for parent in parents:
      node = node[parent]
    node[name] = value
  return ml_collections.ConfigDict(tree)


def nearest(name: str, names) -> str:
  """ "; did you mean X?" for the closest of `names`, or ""."""
  near = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
  return f"; did you mean {near[0]}?" if near else ""


def _pick(source, names, part: str) -> dict:
  """{name: source's value} of `names` that `source` holds; a dotted name (`model.num_classes`)
  as a View of its sub-config's fields."""
  values, nested = {}, {}
  for name in names:
    head, _, leaf = name.partition(".")
    if leaf:
      nested.setdefault(head, []).append(leaf)
    elif name in source:
      values[name] = source[name]
  for head, leaves in nested.items():
    if head in source:
      values[head] = View(_pick(source[head], leaves, part), f"{part}'s {head}", leaves)
  return values


def of_part(registry, name: str, source, prefix: str = "") -> View:
  """The view the part `name` of `registry` is given of `source` (the config; a model's
  sub-config; a parameter group's fields for its optimizer and schedule): its kind's fields
  and those it declared, at their defaults where `source` does not set them; `prefix`: where
  `source` is in the config ("model.", "param_groups.NAME."), for messages (`View.name_of`)."""
  kind_fields, declared = KINDS[registry.kind], registry.declared.get(name, {})
  part = f"{registry.kind} {name!r}"
  values = _pick(source, kind_fields, part)
  values |= {field: source.get(field, d) for field, d in declared.items()}
  register = f"{registry.home}.register({name!r}"
  return View(values, part, kind_fields, tuple(declared), register, prefix)


def one_of(name: str, value, choices) -> None:
  """A user error unless `value` (the field spelt `name`) is one of `choices`."""
  if value not in choices:
    near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)  # close only
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise UserError(f"{name}={value!r} is not one of {', '.join(choices)}{hint}")


def in_ranges(values, ranges, prefix: str = "") -> None:
  """A user error for the first of `ranges` (field, the range in words, the test) whose value
  in `values` (a View, a config, a group's fields) is not a number in its range, the field
  named as the config spells it (`View.name_of`, else `prefix` + field): a part's own check
  (research/registry.py `register(..., check=)`) and the library's."""
  for field, allowed, ok in ranges:
    value = values[field]
    if isinstance(value, bool) or not isinstance(value, int | float) or not ok(value):
      name = values.name_of(field) if isinstance(values, View) else prefix + field
      raise UserError(f"{name}={value!r} must be a number {allowed}")


def reading(source, names, who: str) -> View:
  """A view of the fields `names` of `source` for the library's own `who` (a module that
  declares what it reads): what it is handed instead of the whole config."""
  return View(_pick(source, names, who), who, names)


def for_module(source, module) -> View:
  """The view of `source` (a config) that the library's `module` is handed: the fields it
  declares it reads (its `reads()`, or `READS`), never the whole config."""
  names = module.reads() if hasattr(module, "reads") else module.READS
  return reading(source, names, module.__name__.replace(".", "/") + ".py")
