#!/usr/bin/env bash
# ./launch.sh CONFIG[:variant] [--workdir=DIR] [--config.FIELD=VALUE ...]   train / run an experiment
# ./launch.sh test [PYTEST_ARGS ...]                                         lint + the test suite
# ./launch.sh bench [--small]                                                benchmark ratios
# ./launch.sh lock                                  re-resolve the pinned versions (requirements/)
#
# On first use this creates .venv and installs the project from pyproject.toml with the exact
# versions in requirements/cpu.lock (requirements/cuda12.lock, with the cuda12 extra, when
# `nvidia-smi` finds a GPU); later runs reuse it and start in seconds.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=.venv

setup_venv() {  # $1: the extras to install, e.g. "test" or "test,cuda12"
  local extras=$1 lock=requirements/cpu.lock
  [[ $extras == *cuda12* ]] && lock=requirements/cuda12.lock
  local stamp="$VENV/.installed-$(cat pyproject.toml "$lock" | sha256sum | cut -c1-16)-${extras//,/-}"
  [[ -f $stamp ]] && return
  echo "setting up $VENV (extras: ${extras:-none}, versions: $lock); this happens once ..." >&2
  [[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
  if ! { "$VENV/bin/python" -m pip install --upgrade pip \
      && "$VENV/bin/python" -m pip install -c "$lock" -e ".[${extras}]"; } >"$VENV/install.log" 2>&1; then
    tail -n 20 "$VENV/install.log" >&2
    echo "error: installing the project into $VENV failed; the full log is $VENV/install.log" >&2
    exit 1
  fi
  rm -f "$VENV"/.installed-*
  touch "$stamp"
}

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  exit 1
fi

if [[ $1 == lock ]]; then
  # The newest versions pyproject.toml allows, resolved in a scratch venv; run the suite after.
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  "$PYTHON" -m venv "$scratch/venv"
  pip=("$scratch/venv/bin/python" -m pip)
  "${pip[@]}" install -q --upgrade pip
  "${pip[@]}" install -q -e ".[test]"
  mkdir -p requirements
  "${pip[@]}" freeze --exclude-editable >requirements/cpu.lock
  # The GPU set: the same pins plus what jax[cuda12] adds, resolved (in an empty venv)
  # without downloading it.
  "$PYTHON" -m venv "$scratch/gpu"
  "$scratch/gpu/bin/python" -m pip install -q --upgrade pip
  "$scratch/gpu/bin/python" -m pip install -q --dry-run --report "$scratch/cuda12.json" \
    -c requirements/cpu.lock -e ".[test,cuda12]"
  "$scratch/venv/bin/python" -c 'import json, sys
report = json.load(open(sys.argv[1]))["install"]
pins = sorted("%s==%s" % (r["metadata"]["name"], r["metadata"]["version"]) for r in report
              if r["metadata"]["name"] != "research")
print("\n".join(pins))' "$scratch/cuda12.json" >requirements/cuda12.lock
  wc -l requirements/*.lock
  exit 0
fi

if [[ $1 == test ]]; then
  shift
  setup_venv test
  export XLA_FLAGS="--xla_force_host_platform_device_count=8" JAX_PLATFORMS=cpu
  "$VENV/bin/ruff" check .
  "$VENV/bin/ruff" format --check .
  # One pytest worker per core (pytest-xdist): most of a test's time is single-threaded compiling.
  # worksteal: an idle worker takes queued tests from a busy one, so long tests do not end alone.
  exec "$VENV/bin/python" -m pytest -n "${PYTEST_WORKERS:-auto}" --dist worksteal "$@"
fi

extras=test
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extras=test,cuda12
fi
setup_venv "$extras"

if [[ $1 == bench ]]; then
  shift
  exec "$VENV/bin/python" -m research.benchmark "$@"
fi

config=$1
shift
exec "$VENV/bin/python" -m research.main --config="$config" "$@"
