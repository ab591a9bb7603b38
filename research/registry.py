"""Parts found by name: one registry per kind of part, each in its own home.

A fork adds a model, loss, augmentation op, dataset or optimizer by decorating it in a module
of its own and naming that module in `config.modules` (`research.configuration` imports them
before the config is checked); the shipped parts register the same way. As timm's
`register_model` and big_vision's `pp_modules`.
"""

import difflib
from collections.abc import Callable

from research.errors import UserError


class Registry:
  """{name: a part of one kind}, with what each was registered with."""

  def __init__(self, kind: str, field: str):
    self.kind = kind  # "model", "loss", ...: in messages
    self.field = field  # the config field that names one: "model.name", "loss", ...
    self.parts: dict[str, Callable] = {}
    self.options: dict[str, dict] = {}
    self.fields: dict[str, dict] = {}  # {name: {config field it declares: its default}}

  def register(self, name: str, fields: dict | None = None, **options) -> Callable:
    """A decorator that registers its function under `name` (a user error if taken), with the
    config `fields` it reads besides its kind's, each with its default."""

    def wrap(part: Callable) -> Callable:
      if name in self.parts and _origin(self.parts[name]) != _origin(part):
        where = getattr(self.parts[name], "__module__", "?")
        raise UserError(
          f"{self.kind} {name!r} is registered twice: {where} has it already; give yours "
          "another name"
        )
      self.parts[name] = part
      self.options[name] = options
      self.fields[name] = dict(fields or {})
      return part

    return wrap

  def names(self) -> list[str]:
    return sorted(self.parts)

  def get(self, name: str, modules=(), field: str = "") -> Callable:
    """The part registered as `name`; a user error listing them if none is, which says how
    to add one where the config names no `modules` (`field`: the config field, if not the
    registry's own)."""
    if name not in self.parts:
      raise UserError(self.unknown(name, modules, field))
    return self.parts[name]

  def unknown(self, name: str, modules=(), field: str = "", also=()) -> str:
    """The message for a `name` nothing registered (`also`: names accepted besides)."""
    kind = f"{field or self.field}={name!r} is not a registered {self.kind}"
    return kind + self.choices(name, modules, also)

  def choices(self, name: str, modules=(), also=()) -> str:
    """' (did you mean …?): the names; how to add one' after an unknown `name`: where the
    config names no `modules`, how a fork adds one, else which registered nothing of it."""
    names = [*also, *self.names()]
    near = difflib.get_close_matches(str(name), names, n=1)
    near = f" (did you mean {near[0]!r}?)" if near else ""
    hint = (
      f"; modules {', '.join(modules)} registered no {name!r}"
      if modules
      else "; a fork registers its own in a module named in config.modules (docs/extending.md)"
    )
    return f"{near}: {', '.join(names)}{hint}"


def _origin(part) -> tuple:
  """Where a part is defined: a module imported again registers the same part again."""
  return getattr(part, "__module__", None), getattr(part, "__qualname__", repr(part))
