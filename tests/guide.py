"""docs/extending.md's fork package, as the tests read it: each code block preceded by a line
naming its file."""

import contextlib
import importlib.util
import re
import sys
from pathlib import Path

GUIDE = Path(__file__).parent.parent / "docs" / "extending.md"


def files() -> dict[str, str]:
  """{path: text} of each code block preceded by a line naming its file: `path`:"""
  return dict(re.findall(r"`([\w/]+\.py)`:\n\n```python\n(.*?)```", GUIDE.read_text(), re.S))


def module(path: str, directory: Path):
  """The guide's file `path`, written to `directory` and imported as a module of its own (its
  parts registered; the same module name each time, so registering again is no clash)."""
  file = Path(directory) / Path(path).name
  file.write_text(files()[path])
  spec = importlib.util.spec_from_file_location(f"guide_{file.stem}", file)
  loaded = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = loaded  # as an import leaves it: the library looks parts' modules up
  spec.loader.exec_module(loaded)
  return loaded


@contextlib.contextmanager
def registered():
  """Parts registered inside the block (the guide's modules) are unregistered after it, so
  that a test elsewhere in the process sees only the library's own names."""
  from research import augment
  from research.registry import Registry

  modules = [m for name, m in list(sys.modules.items()) if name.startswith("research")]
  registries = {id(r): r for m in modules for r in vars(m).values() if isinstance(r, Registry)}
  held = lambda r: (r.parts, r.options, r.declared, r.checks)
  saved = [(r, *map(dict, held(r))) for r in registries.values()]
  flags = [(s, set(s)) for s in vars(augment).values() if isinstance(s, set)]
  try:
    yield
  finally:
    for registry, *kept in saved:
      for now, was in zip(held(registry), kept, strict=True):
        now.clear()
        now.update(was)
    for names, before in flags:
      names.intersection_update(before)
