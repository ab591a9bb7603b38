#!/usr/bin/env bash
# ./launch.sh CONFIG[:variant] [--workdir=DIR] [--config.FIELD=VALUE ...]   train / run an experiment
# ./launch.sh test [PYTEST_ARGS ...]                                         lint + the test suite
# ./launch.sh eval WORKDIR [--step=N] [--config.FIELD=VALUE ...]   a run's checkpoint, evaluated again
# ./launch.sh predict WORKDIR PATH ... [--top_k=K] [--output=FILE.csv]   its classes for images
# ./launch.sh python SCRIPT.py [ARGS ...]           the project's Python, `research` importable
# ./launch.sh report [--only PART] [--data DIR]     measure the results table on this machine
# ./launch.sh bench [--only NAME] [--small]         benchmark ratios
# ./launch.sh setup [--gpu|--cpu]                   install .venv now (--gpu: for a GPU node)
# ./launch.sh wheelhouse [--gpu] [--python-version X.Y] [NAME ...]   wheels for offline hosts
# ./launch.sh lock                                  re-resolve the pinned versions (requirements/)
# ./launch.sh rehearse                              a lent GPU host's start (JAX 0.11.2), on CPU
#
# On first use this creates .venv from PYTHON=/path/to/python, else from the newest Python 3.13
# or 3.12 on the PATH or under pyenv, and installs the project with the exact
# versions in requirements/cpu.lock, or requirements/cuda12.lock (the cuda12 extra) when
# `nvidia-smi` finds a GPU or `setup --gpu` asked for it; later runs reuse it and start in
# seconds. A .venv that holds the GPU set is kept on machines without a GPU (JAX runs on CPU).
# RESEARCH_PYTHON=/path/to/python: use that interpreter as it is (no venv, no pip); each
# command checks the imports it needs and names any missing package with its pip command.
# RESEARCH_WHEELHOUSE=DIR: install .venv from the wheels in DIR only (no index, no internet).
set -euo pipefail
caller=$PWD  # the commands read the paths they are given from here
cd "$(dirname "$0")"
root=$PWD

VENV=${RESEARCH_VENV:-.venv}
PYTHONS=(3.13 3.12)  # the versions the locks are tested on, newest first (JAX needs >= 3.12)

python_version() {  # $1: a program; prints its Python's X.Y, or nothing where it does not run
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

served() {  # $1: X.Y or nothing; whether the locks can serve that Python (3.12 or newer)
  [[ -n $1 ]] && ! { [[ ${1%%.*} -eq 3 ]] && [[ ${1#*.} -lt 12 ]]; }
}

find_python() {  # $@: versions X.Y, in order of preference; prints the first found, or nothing
  local version candidate
  for version in "$@"; do  # on the PATH (a pyenv shim runs only where enabled), then pyenv
    for candidate in "python$version" \
        $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".*/bin/python 2>/dev/null | sort -rV); do
      if [[ $(python_version "$candidate") == "$version" ]]; then
        echo "$candidate"
        return
      fi
    done
  done
}

no_python() {  # $@: the versions looked for; the error line, and exit
  local versions
  versions=$(printf ' or %s' "$@")
  echo "error: found no Python ${versions# or } (python$1 on the PATH, or under pyenv); install" \
    "one (pyenv install $1, or the system's python$1 and python$1-venv packages) or name it" \
    "with PYTHON=/path/to/python (the locked JAX needs Python >= 3.12)" >&2
  exit 2
}

base_python() {  # sets PYTHON: PYTHON= as given, else the newest of PYTHONS found, else error
  local version
  if [[ -n ${PYTHON:-} ]]; then
    version=$(python_version "$PYTHON")
    if ! served "$version"; then
      [[ -n $version ]] && version="is Python $version" || version="does not run"
      echo "error: PYTHON=$PYTHON $version;" \
        "the locked JAX needs Python >= 3.12: name one with PYTHON=/path/to/python3.13, or" \
        "leave PYTHON unset to take the newest found" >&2
      exit 2
    fi
    return
  fi
  PYTHON=$(find_python "${PYTHONS[@]}")
  [[ -n $PYTHON ]] || no_python "${PYTHONS[@]}"
}

usage() {  # $1: the exit code (0 when help was asked for)
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit "$1"
}

lock_for() {  # $1: extras
  [[ $1 == *cuda12* ]] && echo requirements/cuda12.lock || echo requirements/cpu.lock
}

stamp_for() {  # $1: extras; names what is installed: the project, its lock and the extras
  echo "$VENV/.installed-$(cat pyproject.toml "$(lock_for "$1")" | sha256sum | cut -c1-16)-${1//,/-}"
}

setup_venv() {  # $1: the extras to install, e.g. "test" or "test,cuda12"
  local extras=$1 lock
  lock=$(lock_for "$extras")
  local version
  version=$(python_version "$VENV/bin/python")
  if [[ -x $VENV/bin/python ]] && ! served "$version"; then
    rm -rf "$VENV"  # made by an older launch.sh from a Python the lock cannot serve
  fi
  [[ -f $(stamp_for "$extras") ]] && return
  base_python
  if [[ $extras != *cuda12* ]] && compgen -G "$VENV/.installed-*cuda12" >/dev/null; then
    rm -rf "$VENV"  # from the GPU set to the CPU one: a fresh venv, no CUDA plugin left over
  fi
  local pip_args=()
  if [[ -n ${RESEARCH_WHEELHOUSE:-} ]]; then
    pip_args=(--no-index --find-links "$RESEARCH_WHEELHOUSE")
  fi
  echo "setting up $VENV (extras: ${extras:-none}, versions: $lock); this happens once ..." >&2
  [[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
  if ! { { [[ -n ${RESEARCH_WHEELHOUSE:-} ]] || "$VENV/bin/python" -m pip install --upgrade pip; } \
      && "$VENV/bin/python" -m pip install "${pip_args[@]}" -c "$lock" -e ".[${extras}]"; } \
      >"$VENV/install.log" 2>&1; then
    tail -n 20 "$VENV/install.log" >&2
    echo "error: installing the project into $VENV failed; the full log is $VENV/install.log." \
      "Without internet: prepare the venv where there is (./launch.sh setup --gpu for a GPU" \
      "node), use RESEARCH_WHEELHOUSE=DIR (./launch.sh wheelhouse), or run on an installed" \
      "Python with RESEARCH_PYTHON=/path/to/python" >&2
    exit 1
  fi
  rm -f "$VENV"/.installed-*
  touch "$(stamp_for "$extras")"
}

wanted_extras() {  # the GPU set where a GPU is seen or the venv holds it already, else the CPU set
  if [[ -f $(stamp_for tools,test,cuda12) ]] \
      || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    echo tools,test,cuda12
  else
    echo tools,test
  fi
}

if [[ $# -lt 1 ]]; then
  echo "error: give a config to train or a command (the usage is below)" >&2
  usage 2
fi
[[ $1 == -h || $1 == --help ]] && usage 0

if [[ $1 == lock ]]; then
  # The newest versions pyproject.toml allows, resolved in a scratch venv; run the suite after.
  base_python
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  "$PYTHON" -m venv "$scratch/venv"
  pip=("$scratch/venv/bin/python" -m pip)
  "${pip[@]}" install -q --upgrade pip
  "${pip[@]}" install -q -e ".[tools,test]"
  mkdir -p requirements
  "${pip[@]}" freeze --exclude-editable >requirements/cpu.lock
  # The GPU set: the same pins plus what jax[cuda12] adds, resolved (in an empty venv)
  # without downloading it.
  "$PYTHON" -m venv "$scratch/gpu"
  "$scratch/gpu/bin/python" -m pip install -q --upgrade pip
  "$scratch/gpu/bin/python" -m pip install -q --dry-run --report "$scratch/cuda12.json" \
    -c requirements/cpu.lock -e ".[tools,test,cuda12]"
  "$scratch/venv/bin/python" -c 'import json, sys
report = json.load(open(sys.argv[1]))["install"]
pins = sorted("%s==%s" % (r["metadata"]["name"], r["metadata"]["version"]) for r in report
              if r["metadata"]["name"] != "research")
print("\n".join(pins))' "$scratch/cuda12.json" >requirements/cuda12.lock
  wc -l requirements/*.lock
  exit 0
fi

if [[ $1 == setup ]]; then
  case ${2:-} in
    --gpu) extras=tools,test,cuda12 ;;
    --cpu) extras=tools,test ;;
    "") extras=$(wanted_extras) ;;
    *) echo "error: setup takes --gpu or --cpu, not '$2'" >&2; exit 2 ;;
  esac
  setup_venv "$extras"
  echo "$VENV holds the versions of $(lock_for "$extras") (extras: $extras)"
  exit 0
fi

if [[ $1 == wheelhouse ]]; then
  # Wheels of the locked versions for a machine without internet (another Python version or
  # platform may be named); install there with pip's --no-index --find-links=DIR.
  shift
  lock=requirements/cpu.lock dest=wheelhouse pyver="" names=()
  while [[ $# -gt 0 ]]; do
    case $1 in
      --gpu) lock=requirements/cuda12.lock ;;
      --python-version) pyver=$2; shift ;;
      --dest) dest=$2; shift ;;
      -*) echo "error: wheelhouse does not take '$1'" >&2; exit 2 ;;
      *) names+=("$1") ;;
    esac
    shift
  done
  base_python
  target=()
  if [[ -n $pyver ]]; then  # another interpreter: binary wheels for manylinux x86-64 only
    target=(--only-binary=:all: --python-version "$pyver" --implementation cp)
    for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
      target+=(--platform "${tag}_x86_64")
    done
  fi
  if [[ ${#names[@]} -eq 0 ]]; then  # everything the lock holds, and what builds the project
    "$PYTHON" -m pip download "${target[@]}" -d "$dest" -r "$lock" "setuptools>=68" wheel
  else  # only these, at their locked versions, without their dependencies
    pins=()
    for name in "${names[@]}"; do  # pip's names: case, -, _ and . do not matter
      pin=$(grep -i -E "^${name//[-_.]/[-_.]}==" "$lock" || true)
      if [[ -z $pin ]]; then
        echo "error: $name is not in $lock; name a package the project installs" >&2
        exit 2
      fi
      pins+=("$pin")
    done
    "$PYTHON" -m pip download "${target[@]}" --no-deps -d "$dest" "${pins[@]}"
  fi
  echo "wrote $dest/; install offline with: python -m pip install --no-index --find-links=$dest NAME ..."
  exit 0
fi

if [[ $1 == rehearse ]]; then
  # A lent GPU host's start, rehearsed on this CPU: a Python 3.12 with the hosts' site JAX
  # 0.11.2, flax and optax (made once, kept in .rehearsal/host), the wheels
  # docs/gpu_hosts.md says to carry, installed as it says, then its commands on 8 fake devices.
  [[ $# -eq 1 ]] || { echo "error: rehearse takes no arguments, not '${*:2}'" >&2; exit 2; }
  rehearsal=${RESEARCH_REHEARSAL:-.rehearsal}
  host=$rehearsal/host/bin/python
  if [[ ! -f $rehearsal/host/.made ]]; then
    py=$(find_python 3.12)
    [[ -n $py ]] || no_python 3.12
    rm -rf "$rehearsal"
    echo "making $rehearsal: Python 3.12 with JAX 0.11.2, as on the lent GPU hosts; once ..." >&2
    "$py" -m venv "$rehearsal/host"
    # The site packages of the hosts that the project or the carried wheels import, at the
    # versions a run there recorded (its metadata.jsonl, 2026-11-26).
    "$host" -m pip install -q jax==0.11.2 jaxlib==0.11.2 flax==0.12.10 optax==0.2.8 \
      numpy==2.5.2 orbax-checkpoint==0.12.4 tensorstore==0.1.85 pillow==12.3.0 tqdm==4.70.1 \
      matplotlib==3.11.2 scipy==1.18.1 absl-py==2.5.0 cloudpickle==3.1.2 etils==1.14.0 \
      psutil==7.2.2 protobuf==7.36.2 pyyaml==6.0.3
    "$0" wheelhouse --python-version 3.12 --dest "$rehearsal/wheelhouse" \
      ml-collections tensorboardX grain array-record portpicker orbax-checkpoint
    touch "$rehearsal/host/.made"
  fi
  rm -rf "$rehearsal/site" "$rehearsal/runs"
  set -x  # from here, what docs/gpu_hosts.md has a host run
  "$host" -m pip install -q --no-index --no-deps --target "$rehearsal/site" \
    "$rehearsal"/wheelhouse/*.whl
  export PYTHONPATH=$rehearsal/site RESEARCH_PYTHON=$host
  export JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8
  "$0" configs/cifar_vgg.py:smoke --workdir="$rehearsal/runs/vgg"
  "$0" configs/cifar_speedrun.py:smoke --workdir="$rehearsal/runs/speedrun"
  "$0" configs/cifar_speedrun.py:smoke --workdir="$rehearsal/runs/seeds" --config.seeds=2
  "$0" report --scale=tiny --workdir="$rehearsal/runs/report"
  { set +x; } 2>/dev/null
  echo "rehearsed: $("$host" -c 'import jax, sys; print(f"JAX {jax.__version__}, Python {sys.version.split()[0]}")'), 8 fake CPU devices: VGG and the speedrun :smoke (and 2 seeds of it), the report at --scale=tiny"
  exit 0
fi

if [[ -n ${RESEARCH_PYTHON:-} ]]; then
  py=$RESEARCH_PYTHON  # as it is: research.environment names what it lacks
  [[ $py == */* && $py != /* ]] && py=$caller/$py  # a relative path: from where it was given
  command -v "$py" >/dev/null 2>&1 || { echo "error: RESEARCH_PYTHON=$py is not a program" >&2; exit 2; }
else
  setup_venv "$(wanted_extras)"
  py=$VENV/bin/python
  [[ $py == /* ]] || py=$root/$py
fi

# Training, eval, predict, report and bench run where the user started them, so that the paths
# they take are read from there; the checkout is found on the PYTHONPATH.
from_caller() {
  cd "$caller"
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
  # Compiled steps are kept between runs (JAX's persistent compilation cache): a config's next
  # launch loads its step instead of compiling it again. Another directory: set this variable;
  # where the default cannot be made (a read-only home), runs compile as without it.
  local cache="$HOME/.cache/research/jax-compilation"
  if [[ -z ${JAX_COMPILATION_CACHE_DIR:-} ]] && mkdir -p "$cache" 2>/dev/null; then
    export JAX_COMPILATION_CACHE_DIR="$cache"
  fi
  exec "$py" "$@"
}

case $1 in
  test)
    shift
    # --quick: the suite without the tests that train runs or start processes (the end_to_end
    # marker, docs/testing.md): a fork's inner loop, about a minute on 2 cores.
    if [[ ${1:-} == --quick ]]; then
      shift
      set -- -m "not end_to_end" "$@"
    fi
    # XLA_FLAGS given here are kept (another CPU kernel set, a debugging flag).
    export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=8" JAX_PLATFORMS=cpu
    "$py" -m research.environment  # pytest, ruff and the core packages, or an error: line
    "$py" -m ruff check .
    "$py" -m ruff format --check .
    # The suite starts many Python processes: where the environment sets
    # PYTHONDONTWRITEBYTECODE, each would compile the project's modules from source again.
    "$py" -m compileall -q research tools configs >/dev/null
    # One pytest worker per core (pytest-xdist): most of a test's time is single-threaded
    # compiling. worksteal: an idle worker takes queued tests from a busy one.
    exec "$py" -m pytest -n "${PYTEST_WORKERS:-auto}" --dist worksteal "$@"
    ;;
  bench) shift; from_caller -m tools.benchmark "$@" ;;
  report) shift; from_caller -m tools.report "$@" ;;
  eval | predict) from_caller -m research.trained "$@" ;;
  python) shift; from_caller "$@" ;;  # the project's interpreter: a script that imports research
  *)
    config=$1
    shift
    module=research.main  # the training library; the scaling report is a tool that runs it
    for arg in "$@"; do
      [[ $arg =~ ^--config\.scaling_report=(True|true|1)$ ]] && module=tools.scaling
    done
    from_caller -m "$module" --config="$config" "$@"
    ;;
esac
