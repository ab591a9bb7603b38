"""Two layers, one direction: the training library (research/) never imports the measurement
tools (tools/), and no module reaches itself through its imports. Every function of the
library reads on one screen."""

import ast
import functools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

ROOT = Path(__file__).parent.parent
LAYERS = ("research", "tools")


def _module_name(path: Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
  """{module: the project modules it imports}, every import statement counted (inside
  functions too), `from package import name` resolved to the submodule where there is one."""
  modules = {_module_name(p): p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")}
  graph = {}
  for name, path in modules.items():
    found = set()
    for module, names in _named_imports(path):
      submodules = {f"{module}.{n}" for n in names} & modules.keys()
      whole = not names or len(submodules) < len(names)  # `import m`, or names of m itself
      found |= submodules | ({module} if whole else set())
    graph[name] = {m for m in found if m in modules and m != name}
  return graph


def _named_imports(path) -> list[tuple[str, list[str]]]:
  """(module, the names taken from it) of every import in the file `path`, anywhere in it:
  `import m` as (m, [])."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found += [(alias.name, []) for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found.append((node.module, [alias.name for alias in node.names]))
  return found


def test_the_training_library_never_imports_the_tools():
  wrong = {
    f"{module} imports {target}"
    for module, targets in _imports().items()
    if module.split(".")[0] == "research"
    for target in targets
    if target.split(".")[0] == "tools"
  }
  assert not wrong, sorted(wrong)


IMPORTS_AT_MOST = 12  # the longest chain of imports, one module importing the next


def test_no_module_imports_itself_through_other_modules_and_the_chains_are_short():
  """No circle in the import graph, a package's modules importing their package included
  (they import what they share from a module of it: research/models/base.py), and no chain of
  imports longer than IMPORTS_AT_MOST, tools/ included."""
  edges = _imports()
  circles, state = [], {}  # state: 1 on the current path, 2 done

  def visit(module, path):
    state[module] = 1
    for target in sorted(edges[module]):
      if state.get(target) == 1:
        circles.append(" -> ".join([*path[path.index(target) :], target]))
      elif target not in state:
        visit(target, [*path, target])
    state[module] = 2

  for module in sorted(edges):
    if module not in state:
      visit(module, [module])
  assert not circles, circles

  @functools.cache
  def depth(module) -> int:  # the imports of the longest chain from `module`
    return max((1 + depth(t) for t in edges[module]), default=0)

  deepest = max(edges, key=depth)
  assert depth(deepest) <= IMPORTS_AT_MOST, (deepest, depth(deepest))


def test_without_the_tools_every_config_loads_and_a_run_trains(tmp_path):
  scratch = tmp_path / "fork"
  ignore = shutil.ignore_patterns(
    ".git", ".venv", ".rehearsal", "runs", ".pytest_cache", "__pycache__", "tools", "results"
  )
  shutil.copytree(ROOT, scratch, ignore=ignore)
  script = (
    "import importlib, pathlib, pkgutil, research\n"
    "from research import configuration\n"
    "for m in pkgutil.walk_packages(research.__path__, 'research.'):\n"
    "  importlib.import_module(m.name)\n"
    "for path in sorted(pathlib.Path('configs').glob('[!_]*.py')):\n"
    "  if path.stem != 'common':\n"
    "    configuration.load(str(path))\n"
    "print('loaded')\n"
  )
  run = lambda *args: subprocess.run(
    [sys.executable, *args], cwd=scratch, capture_output=True, text=True, timeout=600
  )
  loaded = run("-c", script)
  assert loaded.returncode == 0 and "loaded" in loaded.stdout, loaded.stderr[-2000:]
  trained = run(
    "-m", "research.main", "--config=configs/cifar_keras_cnn.py:smoke",
    f"--workdir={tmp_path / 'run'}", "--config.num_train_steps=2", "--config.log_every_steps=1",
  )  # fmt: skip
  assert trained.returncode == 0, trained.stderr[-2000:]
  assert "eval at step 2" in trained.stdout


LONGEST_FUNCTION = 60  # lines, its docstring and comments included


def test_every_function_of_the_library_is_at_most_60_lines():
  """A model's `__call__` excepted: the network as its paper draws it, layer after layer."""
  too_long = []
  for path in sorted((ROOT / "research").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        continue
      lines = node.end_lineno - node.lineno + 1
      model_call = path.parent.name == "models" and node.name == "__call__"
      if lines > LONGEST_FUNCTION and not model_call:
        too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
  assert not too_long, too_long


# Where the whole config may travel: the modules whose job is the config itself, and the run's
# set-up with the loop that calls it; the conv2d experiment's config is all its own fields. Every
# other function of the library takes the fields it reads (a view, research/fields.py) or what
# was built from them.
CONFIG_MODULES = ("main", "configuration", "validate", "sweep", "workdir")
WHOLE_CONFIG = {
  "research/setup.py: setup",
  "research/setup.py: build_step",  # setup's, for each program the run switches to
  "research/train.py: train_and_evaluate",
  "research/train.py: _train_and_evaluate",  # its body, inside the workdir's lock
  "research/experiments/conv2d_scaling.py: check_config",
  "research/experiments/conv2d_scaling.py: measure",
  "research/experiments/conv2d_scaling.py: describe",
  "research/experiments/conv2d_scaling.py: run",
}


def test_below_the_run_s_set_up_no_function_takes_the_whole_config():
  """A parameter named `config` is the whole config; the parts and the library's modules below
  the set-up are handed views (`fields`). At most 8, held here by name."""
  taking = set()
  for path in sorted((ROOT / "research").rglob("*.py")):
    if path.parent.name == "research" and path.stem in CONFIG_MODULES:
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        if "config" in [a.arg for a in arguments]:
          taking.add(f"{path.relative_to(ROOT)}: {node.name}")
  assert taking == WHOLE_CONFIG and len(taking) <= 8, sorted(taking ^ WHOLE_CONFIG)


def test_the_library_imports_nothing_of_the_configs():
  """The library's fields are declared in research/fields.py; configs/ imports them."""
  wrong = {
    f"{module} imports {target}"
    for module, targets in _imports_of(("research",), ("configs",)).items()
    for target in targets
  }
  assert not wrong, sorted(wrong)


def _imports_of(layers, targets) -> dict[str, set[str]]:
  """{module of `layers`: the modules of packages `targets` it imports, anywhere in it}."""
  found = {}
  for layer in layers:
    for path in (ROOT / layer).rglob("*.py"):
      names = {n for module, taken in _named_imports(path) for n in (module, *taken)}
      found[_module_name(path)] = {n for n in names if n.split(".")[0] in targets}
  return found
