"""Loads `configs/x.py[:variant]` and applies `--config.FIELD=VALUE` overrides, with user errors.

We parse overrides ourselves rather than through absl's config_flags so that every mistake
(missing file, unknown field, unparsable value) is one `error:` line that says what to do.
"""

import ast
import contextlib
import difflib
import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path

import ml_collections

from research.errors import UserError


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
  """Sets `config.<field>` (dotted) from its command-line text."""
  fields = _fields(config)
  if field not in fields:
    near = difflib.get_close_matches(field, fields, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(near)}?" if near else "see the config file for its fields"
    raise UserError(f"config has no field {field!r}; {hint}")
  *parents, leaf = field.split(".")
  node = config
  for name in parents:
    node = node[name]
  try:
    node[leaf] = _parse_value(text, node[leaf])
  except ValueError as e:
    raise UserError(f"--config.{field}: {e}") from None
