"""Entry point: loads a config, prepares the workdir and runs the experiment it selects.

  python -m research.main --config=configs/cifar_vgg.py[:variant] [--workdir=DIR]
      [--config.FIELD=VALUE ...] [--allow_config_change]

`./launch.sh CONFIG ...` sets up the environment and calls this.
"""

import argparse
import gc
import importlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

from research import environment, host_memory, peers
from research.errors import EXIT_USER_ERROR, UserError, exit_interrupted


def _env_int(name: str) -> int | None:
  value = os.environ.get(name)
  if value and not value.lstrip("-").isdecimal():
    raise UserError(f"{name}={value!r} is not a whole number")
  return int(value) if value else None


def start_distributed(args, lost_after_sec: int = peers.LOST_AFTER_SEC, resume: str = "") -> None:
  """Joins a multi-process run through jax.distributed; a no-op for one process.

  Explicit flags (or JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID) win; under
  SLURM or Open MPI with several tasks JAX detects everything itself. GPUs talk over NCCL;
  CPU devices need gloo for cross-process collectives.

  A process that vanishes (SIGKILL, the OOM killer, a host gone) is noticed by the others
  within `lost_after_sec` (research/peers.py, started by `run`); `resume`: the arguments of
  ./launch.sh that resume this process, for the error then.
  """
  import jax

  if any(x is not None for x in (args.coordinator_address, args.num_processes, args.process_id)):
    _check_distributed_flags(args)
    kwargs = dict(
      coordinator_address=args.coordinator_address,
      num_processes=args.num_processes,
      process_id=args.process_id,
    )
  elif (
    int(os.environ.get("SLURM_NTASKS", 1)) > 1 or int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1)) > 1
  ):
    kwargs = {}  # auto-detected by jax.distributed
  else:
    return
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  peers.guard(resume)
  # JAX's own check aborts in C++ with no word of what to do: a backstop behind research.peers
  heartbeat = peers.backstop_sec(lost_after_sec)
  jax.distributed.initialize(**kwargs, heartbeat_timeout_seconds=heartbeat)


def _check_distributed_flags(args) -> None:
  if args.num_processes is None or args.process_id is None or not args.coordinator_address:
    raise UserError(
      "multi-process runs need --coordinator_address=HOST:PORT, --num_processes=N and "
      "--process_id=I together (or the JAX_* environment variables)"
    )
  host, _, port = args.coordinator_address.rpartition(":")
  ipv6_unbracketed = ":" in host and not (host.startswith("[") and host.endswith("]"))
  if not host or ipv6_unbracketed or not port.isdecimal() or not 0 < int(port) < 65536:
    raise UserError(
      f"the coordinator address {args.coordinator_address!r} (--coordinator_address or "
      "JAX_COORDINATOR_ADDRESS) is not HOST:PORT: a port of 1 to 65535 that process 0's host "
      "can listen on, e.g. 10.0.0.1:12345 or [fd00::1]:12345"
    )
  if args.num_processes < 1 or not 0 <= args.process_id < args.num_processes:
    raise UserError(
      f"process id {args.process_id} of {args.num_processes} processes (--process_id and "
      "--num_processes, or JAX_PROCESS_ID and JAX_NUM_PROCESSES): each process needs its own "
      "id from 0 to num_processes - 1"
    )


def check_processes_agree(config) -> None:
  """Every process of a run must have the same config: a user error where they do not.
  data_dir may differ (a copy on each host); research/train.py compares the data itself."""
  import jax

  from research.placement import same_in_every_process

  fields = {k: v for k, v in json.loads(config.to_json()).items() if k != "data_dir"}
  if not same_in_every_process(fields):
    raise UserError(
      f"the processes of this run were given different configs (process "
      f"{jax.process_index()} of {jax.process_count()}); start each with the same command, "
      "only --process_id differing"
    )


def parse_args(argv: list[str]):
  parser = argparse.ArgumentParser(prog="research.main", description=__doc__)
  parser.add_argument("--config", required=True, help="configs/NAME.py[:variant]")
  parser.add_argument("--workdir", default="", help="default: a new directory under runs/")
  parser.add_argument(
    "--allow_config_change",
    action="store_true",
    help="resume into a workdir whose config.json differs in fields that change the run",
  )
  group = parser.add_argument_group("multi-process (jax.distributed)")
  group.add_argument("--coordinator_address", default=os.environ.get("JAX_COORDINATOR_ADDRESS"))
  group.add_argument("--num_processes", type=int, default=_env_int("JAX_NUM_PROCESSES"))
  group.add_argument("--process_id", type=int, default=_env_int("JAX_PROCESS_ID"))
  args, rest = parser.parse_known_args(argv)
  from research import configuration  # imports the packages environment.CORE checked

  return args, configuration.overrides(rest)


def _rerun(args, overrides, workdir=None) -> list[str]:
  """The arguments of `./launch.sh` that resume this run (each process its own)."""
  rerun = [args.config, f"--workdir={workdir or args.workdir}"]
  rerun += [f"--config.{f}={v}" for f, v in overrides]
  rerun += ["--allow_config_change"] if args.allow_config_change else []
  if args.num_processes:
    rerun += [f"--coordinator_address={args.coordinator_address}"]
    rerun += [f"--num_processes={args.num_processes}", f"--process_id={args.process_id}"]
  return rerun


def default_workdir(spec: str) -> Path:
  path, _, variant = spec.partition(":")
  name = Path(path).stem + (f"-{variant.replace(',', '-')}" if variant else "")
  return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def load_config(args, overrides):
  """The config `--config` names, with the `--config.FIELD=VALUE` overrides applied."""
  from research import configuration  # imports the packages environment.CORE checked

  config = configuration.load(args.config)
  # A fork's parts imported, their declared fields added and set, every field's owner checked
  configuration.resolve(config, overrides)
  configuration.absolute_paths(config, Path.cwd())  # recorded as absolute: usable from anywhere
  return config


def checked_workdir(args, config) -> Path:
  """The run's workdir (`--workdir`, or a new one under runs/), checked before anything is
  written: writable, and holding nothing another config wrote."""
  import jax

  from research import configuration
  from research import workdir as workdir_lib

  if jax.process_count() > 1 and not args.workdir:
    raise UserError("multi-process runs need --workdir=DIR on a filesystem all hosts share")
  workdir = Path(args.workdir).expanduser() if args.workdir else default_workdir(args.config)
  workdir = workdir.absolute()  # what the run prints and records: usable from anywhere
  workdir_lib.check_writable(workdir)
  workdir_lib.check_resumable(workdir, config, args.allow_config_change, configuration.completed)
  return workdir


def run(argv: list[str]) -> int:
  """Runs what the command line asks for; returns the exit code (0, or 130 after a Ctrl-C)."""
  args, overrides = parse_args(argv)
  config = load_config(args, overrides)
  if config.get("scaling_report"):  # a measurement tool, run by launch.sh; never imported here
    raise UserError(
      "scaling_report=True runs the scaling report: start it with ./launch.sh (it runs "
      "python -m tools.scaling)"
    )
  if config.get("keep_freed_host_memory", True):
    host_memory.keep_freed_memory()  # before JAX starts its threads
  lost_after = config.get("lost_process_after_sec", peers.LOST_AFTER_SEC)
  if "lost_process_after_sec" in config:
    from research import validate

    validate.whole_number(config, "lost_process_after_sec", 1)  # before jax.distributed
  resume = shlex.join(_rerun(args, overrides))
  start_distributed(args, lost_after, resume)
  with peers.watch(lost_after, resume):
    return _run_checked(args, overrides, config)


def _run_checked(args, overrides, config) -> int:

  from research import workdir as workdir_lib

  check_processes_agree(config)
  workdir = checked_workdir(args, config)
  with workdir_lib.write_errors_are_user_errors(workdir):
    return _run_in(workdir, config, args, overrides)


def _run_in(workdir: Path, config, args, overrides) -> int:
  """Runs the experiment `config` selects, writing into `workdir`."""
  import jax

  from research import workdir as workdir_lib
  from research.preemption import Preempted

  if config.experiment == "train":
    from research.train import train_and_evaluate

    _freeze_start_up_objects()
    try:
      # Validates, checks the workdir's data and checkpoints, then writes.
      train_and_evaluate(config, str(workdir), allow_data_change=args.allow_config_change)
    except Preempted as e:
      rerun = shlex.join(_rerun(args, overrides, workdir))
      print(f"{e}; checkpoint written. To resume, run:\n  ./launch.sh {rerun}")
      return e.exit_code
    return 0
  experiments = [p.stem for p in Path(__file__).parent.glob("experiments/[!_]*.py")]
  if config.experiment not in experiments:
    raise UserError(
      f"experiment={config.experiment!r} is unknown; use 'train' or one of {experiments}"
    )
  environment.check(environment.PLOTS)
  experiment = importlib.import_module(f"research.experiments.{config.experiment}")
  _freeze_start_up_objects()
  experiment.check_config(config, jax.local_device_count())  # before anything is written
  workdir_lib.prepare(workdir, config)
  experiment.run(config, str(workdir))
  return 0


def _freeze_start_up_objects() -> None:
  """Takes what the imports made (some 150,000 objects that live as long as the process) out of
  the garbage collector's sight: its collections during the run traverse only what the run
  itself allocates. Called once the experiment's modules are imported."""
  gc.freeze()


def main() -> int:
  try:
    environment.check(environment.CORE)  # before the first import of any of them
    return run(sys.argv[1:])
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USER_ERROR
  except KeyboardInterrupt:  # Ctrl-C before training started: nothing to save
    peers.ended()
    exit_interrupted("\ninterrupted")
  finally:  # whatever Python itself ends with (a traceback too) speaks for itself
    peers.ended()


if __name__ == "__main__":
  sys.exit(main())
