"""Parts found by name: one registry per kind of part, each in its own home.

A fork adds a model, loss, augmentation op, dataset or optimizer by decorating it in a module
of its own and naming that module in `config.modules` (`research.configuration` imports them
before the config is checked); the shipped parts register the same way. As timm's
`register_model` and big_vision's `pp_modules`.
"""

import difflib
from collections.abc import Callable

from research import fields as fields_lib
from research.errors import UserError


class Registry:
  """{name: a part of one kind}, with what each was registered with and the config fields it
  declares (research/fields.py)."""

  def __init__(self, kind: str, field: str, home: str):
    self.kind = kind  # "model", "loss", ...: in messages, and its fields (fields.KINDS)
    self.field = field  # the config field that names one: "model.name", "loss", ...
    self.home = home  # the module whose `register` adds one: "research.losses"
    self.parts: dict[str, Callable] = {}
    self.options: dict[str, dict] = {}
    self.declared: dict[str, dict] = {}  # {name: {config field it declares: its default}}
    self.checks: dict[str, Callable] = {}  # {name: its own check of its fields}
    fields_lib.REGISTERED.append(self.declared)  # what a View knows to be a field

  def register(
    self, name: str, fields: dict | None = None, check: Callable | None = None, **options
  ) -> Callable:
    """A decorator that registers its function under `name` (a user error if taken), with the
    config `fields` it reads besides its kind's, {field: its default}: a run naming the part
    adds them to its config (research/configuration.py), where the config file and the command
    line set them as any other field. `check(view)`, where given, checks them: handed the view
    the part is given (research/fields.py `of_part`), it raises a UserError for a value the
    part cannot take, naming the field as `view.name_of(field)` spells it; research/validate.py
    calls it after the library's own checks, before any data loads."""
    declared = dict(fields or {})
    self._check_declared(name, declared)

    def wrap(part: Callable) -> Callable:
      if name in self.parts and _origin(self.parts[name]) != _origin(part):
        where = getattr(self.parts[name], "__module__", "?")
        raise UserError(
          f"{self.kind} {name!r} is registered twice: {where} has it already; give yours "
          "another name"
        )
      self.parts[name] = part
      self.options[name] = options
      self.declared[name] = declared
      self.checks[name] = check
      return part

    return wrap

  def _check_declared(self, name: str, declared: dict) -> None:
    """A user error for a declared field the library owns (it has its own default and
    meaning; a part of this kind reads its kind's fields without declaring them)."""
    if not declared:
      return
    names = [n for n in declared if not isinstance(n, str) or not n.isidentifier()]
    owned = fields_lib.KINDS["model"] if self.kind == "model" else [*fields_lib.library(), "model"]
    taken = [n for n in declared if n in owned]
    if names or taken:
      bad = (names or taken)[0]
      why = "is not a field name" if names else "is the library's own field"
      raise UserError(
        f"{self.home}.register({name!r}, fields=...): {bad!r} {why}; declare the fields your "
        f"part adds, each a name with its default (a {self.kind} reads "
        f"{', '.join(fields_lib.KINDS[self.kind]) or 'no library field'} without declaring them)"
      )

  def check(self, name: str, view) -> None:
    """The part's own check of its fields (`register(..., check=)`), if it has one."""
    if own := self.checks.get(name):
      own(view)

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
