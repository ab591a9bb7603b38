"""airbench94_muon, the speedrun's PyTorch original, or hiverge's cifar10_speedrun, the record
holder built on it, on the same GPU and the same pixels.

  python -m tools.peer_airbench --script airbench94_muon.py --pixels cifar.npz --runs 3
  python -m tools.peer_airbench --script cifar10_speedrun.py --pixels cifar.npz --runs 3 \
    --sleep_cycles 6000000000

`airbench94_muon.py` (K. Jordan, github.com/KellerJordan/cifar10-airbench) and
`cifar10_speedrun.py` (github.com/hiverge/cifar10-speedrun) are not part of this project and
never a dependency: the report runs them where PyTorch sees a CUDA GPU and the script is at
hand (docs/gpu_hosts.md). Both define CifarNet, main(run, model) and print_training_details,
and read CIFAR-10 from cifar10/{train,test}.pt in their working directory; these are written
from `--pixels` (the images our runs decode), so all recipes train on the same images. A
script runs as its own `__main__` does: the model compiled once (torch.compile, max-autotune),
a warmup run, then `--runs` runs (hiverge's after a GPU sleep each, `--sleep_cycles`). Prints
one JSON line: for each run the script's own `time_seconds` (the whitening init, training and
the TTA eval, timed with CUDA events; its per-epoch evals excluded), its parts as
far as its rows give them (each epoch's row: the time so far, the first row's including the
whitening; the TTA eval: the final time less the last epoch's), its accuracy with TTA and its
last epoch's without; and the warmup's wall time (compile included).
"""

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def write_pixels(pixels: Path, directory: Path) -> None:
  """The images and labels of `pixels` (an .npz of train/test images and labels) as the
  script's cifar10/train.pt and test.pt (uint8 NHWC images, int64 labels, class names).

  The training images go in a fixed random order: the script computes its whitening from its
  first 5000, and an image folder lists its classes one after another (CIFAR-10's own files
  mix them).
  """
  import torch

  data = np.load(pixels)
  directory.mkdir(parents=True, exist_ok=True)
  classes = [str(c) for c in range(int(data["num_classes"]))]
  mixed = np.random.default_rng(0).permutation(len(data["train_labels"]))
  for split, rows in (("train", mixed), ("test", slice(None))):
    images = torch.from_numpy(data[f"{split}_images"][rows])
    labels = torch.from_numpy(data[f"{split}_labels"][rows].astype(np.int64))
    torch.save({"images": images, "labels": labels, "classes": classes}, directory / f"{split}.pt")


def _plain(value):
  """A row's value as JSON holds it (the script's are Python or tensor scalars, or None)."""
  return value.item() if hasattr(value, "item") else value


def load_script(path: Path):
  sys.argv = [str(path)]  # the script reads its own source from sys.argv[0], for its logs
  spec = importlib.util.spec_from_file_location("airbench94_muon", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--script", type=Path, required=True, help="airbench94_muon.py")
  parser.add_argument("--pixels", type=Path, required=True, help="train/test images, .npz")
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--workdir", type=Path, default=Path("."))
  parser.add_argument(
    "--sleep_cycles", type=int, default=0, help="GPU cycles to sleep before each run"
  )
  args = parser.parse_args()
  script, pixels = args.script.resolve(), args.pixels.resolve()
  args.workdir.mkdir(parents=True, exist_ok=True)
  os.chdir(args.workdir)
  import torch

  write_pixels(pixels, Path("cifar10"))
  airbench = load_script(script)
  rows = []  # what the script would print: each epoch's locals, then the final eval's

  def record(variables, is_final_entry):
    fields = ("epoch", "train_loss", "train_acc", "val_acc", "tta_val_acc", "time_seconds")
    rows.append({k: _plain(variables.get(k)) for k in fields})

  airbench.print_training_details = record
  model = airbench.CifarNet().cuda().to(memory_format=torch.channels_last)
  model.compile(mode="max-autotune")
  start = time.perf_counter()
  airbench.main("warmup", model)
  torch.cuda.synchronize()
  warmup_sec = time.perf_counter() - start
  runs = []
  for run in range(args.runs):
    rows.clear()
    if args.sleep_cycles:  # as hiverge's __main__ does before each run
      torch.cuda.empty_cache()
      torch.cuda.synchronize()
      torch.cuda._sleep(args.sleep_cycles)
    result = airbench.main(run, model)
    # airbench94_muon returns its TTA accuracy; hiverge's (val_acc, tta_val_acc, time_seconds)
    tta_accuracy = result[1] if isinstance(result, tuple) else result
    final = rows[-1]
    runs.append(
      {
        "time_sec": final["time_seconds"],
        # the TTA eval: the final time less the last epoch's, where the script prints epochs
        "eval_sec": final["time_seconds"] - rows[-2]["time_seconds"] if len(rows) > 1 else None,
        "epochs": rows[:-1],
        "tta_accuracy": tta_accuracy,
        "accuracy": final["val_acc"],
      }
    )
  versions = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
  print(json.dumps({"runs": runs, "warmup_sec": warmup_sec, **versions}))


if __name__ == "__main__":
  main()
