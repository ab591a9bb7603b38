"""Fields every training config has; each experiment's config starts from these."""

import ml_collections

from research.errors import UserError


def training_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
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

  # Data.
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

  # Optimizer (optax).
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

  # Logging and evaluation.
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
  return c


def apply_variant(config: ml_collections.ConfigDict, arg: str | None, variants: dict) -> None:
  """Applies `arg` ("smoke", or several joined by ",") from `variants` {name: fn(config)}."""
  for name in filter(None, (arg or "").split(",")):
    if name not in variants:
      raise UserError(f"unknown config variant {name!r}; choose from: {', '.join(variants)}")
    variants[name](config)


def extend(parent, arg: str | None, variants: dict) -> ml_collections.ConfigDict:
  """A config built on another: `parent` (a config module, with its VARIANTS) gives its
  config and applies the variants of `arg` it has; then `variants` {name: fn(config)} apply
  the rest, in `arg`'s order. `get_config(arg)` of a config that adds an optimizer, say:
  `return extend(cifar_vgg, arg, {"adamw": _adamw})`; `:smoke,adamw` takes both."""
  names = list(filter(None, (arg or "").split(",")))
  known = {**parent.VARIANTS, **variants}
  if unknown := [n for n in names if n not in known]:
    raise UserError(f"unknown config variant {unknown[0]!r}; choose from: {', '.join(known)}")
  config = parent.get_config(",".join(n for n in names if n not in variants) or None)
  apply_variant(config, ",".join(n for n in names if n in variants), variants)
  return config
