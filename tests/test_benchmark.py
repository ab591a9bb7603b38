"""The benchmarks' own code paths run (their ratios are measured on real hosts, not here)."""

from research import benchmark, configuration


def test_host_augmented_batches_from_worker_processes_train_the_step():
  config = configuration.load("configs/cifar_vgg.py:smoke")
  assert benchmark.host_augmented(config, steps=2, workers=1) > 0  # examples/s
