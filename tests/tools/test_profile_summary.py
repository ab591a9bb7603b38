"""A GPU profile summed by kind of op, with the GPU's idle share; and the run's profile window
says what it held besides steps."""

import gzip
import json

import pytest

from research import configuration
from research.train import train_and_evaluate
from tools import profile_summary

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

GPU, HOST = 7, 8


def _trace(path, kernels):
  """A Chrome trace as jax.profiler writes one: a GPU process with kernels on two streams, and a
  host process whose events are not kernels."""
  events = [
    {"ph": "M", "name": "process_name", "pid": GPU, "args": {"name": "/device:GPU:0"}},
    {"ph": "M", "name": "process_name", "pid": HOST, "args": {"name": "/host:CPU"}},
    {"ph": "X", "pid": HOST, "tid": 1, "ts": 0, "dur": 99_000, "name": "train_step"},
  ]
  events += [
    {"ph": "X", "pid": GPU, "tid": stream, "ts": start, "dur": end - start, "name": name}
    for stream, start, end, name in kernels
  ]
  path.parent.mkdir(parents=True, exist_ok=True)
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": events}, f)


def test_kernels_are_summed_by_kind_and_the_idle_share_is_the_window_without_any(tmp_path, capsys):
  _trace(
    tmp_path / "profile/plugins/profile/1/host.trace.json.gz",
    [
      (1, 0, 10_000, "sm90_xmma_fprop_implicit_gemm_bf16"),  # a convolution
      (1, 10_000, 12_000, "select_and_scatter_fusion"),
      (2, 11_000, 13_000, "loop_multiply_fusion"),  # on another stream, overlapping
      (1, 20_000, 25_000, "input_reduce_fusion"),  # after 7 ms without a kernel
      (1, 25_000, 26_000, "sm90_xmma_gemm_bf16bf16_bf16f32"),  # cuBLAS: a matrix product
      (1, 26_000, 27_000, "scatter_update_fusion"),  # a scatter, not the max-pool's
    ],
  )
  assert profile_summary.main([str(tmp_path / "profile"), "--json"]) == 0
  result = json.loads(capsys.readouterr().out)
  assert result["kinds"] == {
    "convolutions": 10.0,
    "reductions": 5.0,
    "elementwise and other fusions": 3.0,
    "max-pool gradient (select-and-scatter)": 2.0,
    "matrix products": 1.0,
  }
  assert result["kernels_ms"] == 21.0 and result["busy_ms"] == 20.0  # 1 ms overlapped
  assert result["window_ms"] == 27.0 and abs(result["idle_share"] - 7 / 27) < 1e-12


def test_a_trace_without_gpu_kernels_is_one_error_line(tmp_path, capsys):
  _trace(tmp_path / "cpu.trace.json.gz", [])
  assert profile_summary.main([str(tmp_path / "cpu.trace.json.gz")]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: the trace has no GPU kernels") and err.count("\n") == 1
  assert profile_summary.main([str(tmp_path / "nothing")]) == 2


def test_the_profile_window_says_what_it_held_besides_steady_steps(tmp_path, capsys):
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(synthetic_train_size=64, synthetic_test_size=32, synthetic_image_size=16)
  config.update(batch_size=16, eval_batch_size=16, num_train_steps=8, log_every_steps=3)
  config.update(eval_every_steps=4, profile_steps=(2, 5))
  train_and_evaluate(config, str(tmp_path / "run"))
  said = [line for line in capsys.readouterr().out.splitlines() if "wrote a profile" in line]
  assert said == [
    f"wrote a profile of steps 2-5 to {tmp_path / 'run' / 'profile'}; it holds a log line at "
    "step 3, an eval at step 4"
  ]
  assert list((tmp_path / "run" / "profile").glob("**/*.trace.json.gz"))
