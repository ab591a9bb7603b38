"""Loads `configs/x.py[:variant]` and applies `--config.FIELD=VALUE` overrides, with user errors.

We parse overrides ourselves rather than through absl's config_flags so that every mistake
(missing file, unknown field, unparsable value) is one `error:` line that says what to do.
"""

import ast
import contextlib
import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path

import ml_collections

from research import environment
from research import fields as fields_lib
from research import workdir as workdir_lib
from research.errors import UserError
from research.fields import nearest


def load(spec: str) -> ml_collections.ConfigDict:
  """`spec` is `path/to/config.py` or `path/to/config.py:variant`."""
  path, _, arg = spec.partition(":")
  if not Path(path).is_file():
    raise UserError(f"config file {path} not found; configs here: {', '.join(_configs_here())}")
  root = str(Path(path).resolve().parent.parent)  # so configs can `from configs.common import`
  if root not in sys.path:
    sys.path.insert(0, root)
  module_spec = importlib.util.spec_from_file_location(f"_config_{Path(path).stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  with _one_line(path):
    module_spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise UserError(
      f"{path} defines no get_config(), so it is not a config; configs here: "
      f"{', '.join(_configs_here())}"
    )
  with _one_line(path):
    return module.get_config(arg or None)


@contextlib.contextmanager
def _one_line(path: str):
  """A config file that does not run (a syntax error, a missing name, an exception in
  get_config) as one user error: the file, the line of it that failed, the exception."""
  try:
    yield
  except UserError:
    raise
  except SyntaxError as e:
    raise UserError(f"{path}:{e.lineno}: SyntaxError: {e.msg}") from None
  except Exception as e:
    file = Path(path).resolve()
    frames = [
      f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == file
    ]
    line = f":{frames[-1].lineno}" if frames else ""
    raise UserError(f"{path}{line}: {type(e).__name__}: {e}") from None


PATH_FIELDS = ("data_dir", "init_from")  # read from where the command was started


def absolute_paths(config: ml_collections.ConfigDict, base: Path) -> None:
  """Makes the config's paths absolute (`~` expanded), read relative to `base`: the directory a
  command was started from, or for a run's recorded config, where runs recorded before paths
  were made absolute were started (the repository root, as launch.sh ran them)."""
  for field in PATH_FIELDS:
    if config.get(field):
      config[field] = str((base / Path(config[field]).expanduser()).resolve())


def import_modules(config: ml_collections.ConfigDict) -> None:
  """Imports the modules `config.modules` names, where a fork registers its parts; a user
  error for one that does not import."""
  modules = config.get("modules", ())
  if isinstance(modules, str) or not all(isinstance(m, str) for m in modules):
    raise UserError(f"modules={modules!r} must be a tuple of module names, e.g. ('myexp',)")
  root = str(Path(__file__).resolve().parent.parent)  # the repository's: its fork packages
  if root not in sys.path:
    sys.path.append(root)
  for name in modules:
    try:
      importlib.import_module(name)
    except UserError:
      raise
    except Exception as e:
      raise UserError(
        f"modules: {name!r} does not import ({type(e).__name__}: {e}); a module here is "
        "importable from the repository root or the PYTHONPATH, e.g. 'myexp' for myexp/"
      ) from None


def _configs_here() -> list[str]:
  """The files of configs/ that define get_config (not the helpers they share)."""
  paths = (Path(__file__).parent.parent / "configs").glob("[!_]*.py")
  here = lambda p: os.path.relpath(p) if p.is_relative_to(Path.cwd()) else str(p)
  return sorted(here(p) for p in paths if "\ndef get_config(" in p.read_text())


def _fields(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  names = []
  for key, value in config.items():
    names.append(prefix + key)
    if isinstance(value, ml_collections.ConfigDict):
      names += _fields(value, f"{prefix}{key}.")
  return names


def _parse_value(text: str, current):
  """Parses `text` as the type of the field's current value."""
  if isinstance(current, str):
    return text
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    if isinstance(current, tuple):  # names as a shell user writes them: mine, or mine,theirs
      return tuple(name.strip() for name in text.split(",") if name.strip())
    raise ValueError(f"cannot parse {text!r} as {_a(type(current))}") from None
  if isinstance(current, bool) and not isinstance(value, bool):
    raise ValueError(f"{text!r} is not True or False")
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if isinstance(current, tuple) and isinstance(value, list):
    value = tuple(value)
  if current is not None and not isinstance(value, type(current)):
    raise ValueError(f"{text!r} is {_a(type(value))}, not {_a(type(current))}")
  return value


def _a(kind: type) -> str:
  """The type's name with its article: "an int", "a float"."""
  return f"{'an' if kind.__name__[0] in 'aeiou' else 'a'} {kind.__name__}"


def overrides(arguments: list[str]) -> list[tuple[str, str]]:
  """[(field, text)] of command-line `--config.FIELD=VALUE` arguments; anything else is a
  user error."""
  pairs = []
  for item in arguments:
    field, sep, value = item.removeprefix("--config.").partition("=")
    if not item.startswith("--config.") or not sep:
      raise UserError(f"unknown argument {item!r}; expected --config.FIELD=VALUE")
    pairs.append((field, value))
  return pairs


def override(config: ml_collections.ConfigDict, field: str, text: str) -> None:
  """Sets `config.<field>` (dotted), a field it has, from its command-line text."""
  fields = _fields(config)
  if field not in fields:
    raise UserError(f"--config.{field}: no part of this run reads it{nearest(field, fields)}")
  *parents, leaf = field.split(".")
  node = config
  for name in parents:
    node = node[name]
  _set(node, leaf, text, node[leaf], field)


def _set(node, leaf: str, text: str, like, field: str) -> None:
  """node[leaf] from `text`, parsed as the type of `like`."""
  try:
    node[leaf] = _parse_value(text, like)
  except ValueError as e:
    raise UserError(f"--config.{field}: {e}") from None


def resolve(config: ml_collections.ConfigDict, overrides) -> None:
  """Applies the command line's [(field, text)] to a training config loaded from its file: the
  fields it has first (those that name parts among them), then the parts' modules imported and
  their declared fields added (`complete`), then the fields of parts only they declare; and
  checks that every field has an owner (`check_owned`)."""
  held = []
  for field, text in overrides:
    if field in _fields(config):
      override(config, field, text)
    else:
      held.append((field, text))
  import_modules(config)
  complete(config)
  for field, text in held:
    *parents, leaf = field.split(".")
    node = config
    for name in parents:
      node = node[name] if isinstance(node, ml_collections.ConfigDict) and name in node else None
    default = _declared_default(config, field)
    if node is None or default is MISSING:
      owned = _fields(config) + list(owners())
      raise UserError(
        f"--config.{field}: no part of this run reads it{nearest(field, owned)}{_unknown(config)}"
      )
    _set(node, leaf, text, default, field)
  check_owned(config)


def _unknown(config) -> str:
  """ " (loss 'focal' is not registered: ...)" for the first part `config` names that nothing
  registered, whose fields are unknown for that reason; else "". (Datasets aside: the built-in
  folders and TFDS names are not registered parts.)"""
  for registry, name in _names(config):
    if registry.kind != "dataset" and name not in registry.parts:
      return (
        f" ({registry.kind} {name!r} is not registered: is the module that registers it "
        "in --config.modules?)"
      )
  return ""


MISSING = object()  # a field nobody declares


# --- owners: the library and the parts a config can name ---------------------------------------


def _registries() -> dict:
  """{config field that names a part: its registry}: the kinds whose parts read the config."""
  from research import data, losses, metrics, models, optim, schedules, steps

  return {
    "model.name": models.MODELS,
    "loss": losses.LOSSES,
    "dataset": data.DATASETS,
    "optimizer": optim.OPTIMIZERS,
    "schedule": schedules.SCHEDULES,
    "step": steps.STEPS,
    "eval_metrics": metrics.EVAL_METRICS,
  }


def _names(config):
  """(registry, name) of each part `config` names, registered or not (at the top level: a
  model's fields are its sub-config's, a group's optimizer's and schedule's the group's)."""
  for field, registry in _registries().items():
    node, leaf = (config.get("model"), "name") if field == "model.name" else (config, field)
    value = node.get(leaf) if isinstance(node, ml_collections.ConfigDict) else None
    for name in value if isinstance(value, tuple | list) else (value,):
      if isinstance(name, str) and name:
        yield registry, name


def named(config) -> list:
  """[(registry, name)] of the registered parts `config` names (`_names`)."""
  return [(registry, name) for registry, name in _names(config) if name in registry.parts]


def complete(config: ml_collections.ConfigDict) -> None:
  """Adds the fields the parts `config` names declare, at their defaults, where it lacks them:
  a model's to its sub-config, the others' to the config."""
  if config.get("experiment", "train") != "train":
    return
  for registry, name in named(config):
    node = config.model if registry.kind == "model" else config
    for field, default in registry.declared.get(name, {}).items():
      if field not in node:
        node[field] = default


def owners() -> dict:
  """{field path: its owners in words} of every field a registered part declares: at the top
  level (losses, datasets, optimizers, schedules, steps, metrics), in the model's sub-config
  (`model.FIELD`, models) and in a parameter group (`param_groups.*.FIELD`, optimizers and
  schedules)."""
  found = {}
  for registry in _registries().values():
    for name, declared in registry.declared.items():
      top = registry.kind != "model"
      paths = [f if top else f"model.{f}" for f in declared]
      if registry.kind in ("optimizer", "schedule"):
        paths += [f"param_groups.*.{f}" for f in declared]
      for path in paths:
        found.setdefault(path, []).append(f"{registry.kind} {name!r}")
  return {path: " and ".join(parts) for path, parts in found.items()}


def _group_fields() -> list:
  """What a parameter group may set: its own fields, its optimizer's and its schedule's (the
  library's and those registered optimizers and schedules declare)."""
  kinds = fields_lib.KINDS
  declared = [f.removeprefix("param_groups.*.") for f in owners() if f.startswith("param_gr")]
  return [*fields_lib.GROUP, *kinds["optimizer"], *kinds["schedule"], *declared]


def _declared_default(config, path: str):
  """The default of the field at `path` that a registered part declares (in a parameter group:
  what the group inherits, the config's value of a field the library owns), or MISSING."""
  *parents, leaf = path.split(".")
  if len(parents) == 2 and parents[0] == "param_groups" and leaf in _group_fields():
    if leaf in config:
      return config[leaf]
    if leaf in fields_lib.GROUP_DEFAULTS:
      return fields_lib.GROUP_DEFAULTS[leaf]
    path = f"param_groups.*.{leaf}"
  if path not in owners():
    return MISSING
  for registry in _registries().values():
    for declared in registry.declared.values():
      if leaf in declared:
        return declared[leaf]
  return MISSING


def check_owned(config: ml_collections.ConfigDict) -> None:
  """A user error for a field no owner declares, with the nearest names: at the top level
  neither the library nor a registered part; in the model's sub-config neither a model's kind
  nor a registered model; in a parameter group nothing a group may set (`_group_fields`)."""
  if config.get("experiment", "train") != "train":
    return
  declared = owners()
  top = ["model", *fields_lib.library().keys(), *(f for f in declared if "." not in f)]
  model = [*(f"model.{f}" for f in fields_lib.KINDS["model"]), *declared]
  paths = list(config)
  if isinstance(config.get("model"), ml_collections.ConfigDict):
    paths += [f"model.{f}" for f in config.model]
  for path in paths:
    if path not in (model if path.startswith("model.") else top):
      known = model if path.startswith("model.") else top
      raise UserError(f"{path}: no part of this run reads it{nearest(path, known)}")
  group = _group_fields()
  for name, fields in config.get("param_groups", {}).items():
    for field in fields if isinstance(fields, ml_collections.ConfigDict) else ():
      if field not in group:
        raise UserError(
          f"param_groups.{name}.{field}: a parameter group reads none such (it sets match, "
          f"train_fraction and its optimizer's and schedule's fields){nearest(field, group)}"
        )


def unused(config: ml_collections.ConfigDict) -> list[str]:
  """Notes on the fields `config` sets that no part of this run reads: those of registered
  parts it does not name (its loss switched on the command line, say)."""
  if config.get("experiment", "train") != "train":
    return []
  read = {*fields_lib.library().keys(), *(f"model.{f}" for f in fields_lib.KINDS["model"])}
  for registry, name in named(config):
    declared = registry.declared.get(name, {})
    read.update(f if registry.kind != "model" else f"model.{f}" for f in declared)
  paths = [*config, *(f"model.{f}" for f in config.get("model", {}))]
  declared = owners()
  return [
    f"note: {path} is {declared.get(path, 'a part')}'s, which this run does not use"
    for path in paths
    if path not in read and path != "model"
  ]


def run_config(workdir: Path) -> ml_collections.ConfigDict:
  """The config the run in `workdir` last trained with (launches.jsonl, or config.json)."""
  saved = workdir_lib.last_config(workdir)
  if saved is None:
    raise UserError(f"{workdir} holds no config.json: it is not a run's workdir")
  config = completed(saved)
  if config.get("experiment") != "train":
    raise UserError(
      f"{workdir} holds a {config.get('experiment')!r} experiment, not a training run"
    )
  return config


def completed(saved: dict) -> ml_collections.ConfigDict:
  """A training run's recorded config (`saved`) as today's code reads it: the fields added
  since the run at their defaults, the library's and those its parts declared since."""
  config = ml_collections.ConfigDict(saved)
  if config.get("experiment") != "train":
    return config
  defaults = fields_lib.library()
  defaults.update(config)
  config = defaults
  absolute_paths(config, environment.ROOT)  # runs that recorded them relative
  import_modules(config)  # the fork's parts the run was trained with
  complete(config)
  return config
