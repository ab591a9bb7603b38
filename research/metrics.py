"""Where a run's numbers go: the console line, WORKDIR/metrics.jsonl and run metadata."""

import json
import time
from pathlib import Path


def format_train_line(record: dict) -> str:
  """The line the original TensorFlow scripts printed, then what we add to it."""
  return (
    f"step {record['step']}, loss = {record['loss']:.4f} "
    f"({record['examples_per_sec']:.1f} examples/sec; {record['sec_per_batch']:.3f} sec/batch)"
    f" accuracy {record['accuracy']:.3f}, input wait {100 * record['input_wait_fraction']:.1f}%"
  )


def format_eval_line(record: dict) -> str:
  return (
    f"eval at step {record['step']}: loss = {record['eval_loss']:.4f}, "
    f"accuracy = {record['eval_accuracy']:.4f} over {record['eval_examples']} examples"
  )


class MetricsLog:
  """Appends one JSON object per record to WORKDIR/metrics.jsonl and prints it."""

  def __init__(self, workdir: str, *, dataset_used: str, enabled: bool = True):
    self.path = Path(workdir) / "metrics.jsonl"
    self.dataset_used = dataset_used
    self.enabled = enabled  # only process 0 writes in multi-process runs

  def _write(self, record: dict) -> None:
    if self.enabled:
      record = {**record, "dataset_used": self.dataset_used, "time": time.time()}
      with open(self.path, "a") as f:
        f.write(json.dumps(record) + "\n")

  def train(self, record: dict) -> None:
    if self.enabled:
      print(format_train_line(record), flush=True)
    self._write(record)

  def eval(self, record: dict) -> None:
    if self.enabled:
      print(format_eval_line(record), flush=True)
    self._write(record)
