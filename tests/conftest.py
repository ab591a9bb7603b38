"""Tests run on CPU with 8 fake XLA devices, set before JAX initialises."""

import os
import signal

# The suite checks values, not speed: XLA's backend (LLVM) optimizations off halves compile
# times, most of the suite's time; the steps run slower, and there are few of them.
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "")
  + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole suite, its xdist workers and the runs it starts
# as subprocesses: many tests compile the same tiny models; each compiles once per machine.
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR",
  os.path.join(os.path.dirname(os.path.dirname(__file__)), ".pytest_cache", "jax-compilation"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# The runs the suite starts take Ctrl-C as a terminal's foreground job does. A suite started
# as a script's background job (`./launch.sh test &`) inherits SIGINT ignored, and so would
# every run it starts, since exec keeps an ignored signal ignored (and research/preemption.py
# keeps it so): the tests that send a run SIGINT would see it ignored. Caught here, it is back
# at its default in every process started from here on.
signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite's runs are :smoke-sized, whose configs keep glibc's default malloc (compile-bound
# runs; research/host_memory.py): its in-process runs do as research.main does for them.

import gc  # noqa: E402
import io  # noqa: E402
import itertools  # noqa: E402
import pickle  # noqa: E402
import tarfile  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def cifar_batch(n: int, seed: int) -> tuple[bytes, np.ndarray, np.ndarray]:
  """One batch file as the official release pickles it: rows of 1024 R, 1024 G, 1024 B."""
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
  labels = rng.integers(0, 10, n).tolist()
  batch = {
    b"batch_label": f"batch {seed}".encode(),
    b"labels": labels,
    b"data": images.transpose(0, 3, 1, 2).reshape(n, 3072),
    b"filenames": [f"img_{seed}_{i}.png".encode() for i in range(n)],
  }
  return pickle.dumps(batch, protocol=2), images, np.asarray(labels)


def pytest_collection_finish(session):
  """What the imports and the collection made lives as long as the worker: out of the garbage
  collector's sight, as research.main does once its modules are imported."""
  gc.freeze()


@pytest.fixture
def cifar_archive(tmp_path):
  """A small cifar-10-python.tar.gz (7 images per batch) and the arrays it holds."""
  path = tmp_path / "cifar-10-python.tar.gz"
  arrays = {}
  with tarfile.open(path, "w:gz") as tar:
    for seed, name in enumerate(BATCHES):
      raw, images, labels = cifar_batch(7, seed)
      arrays[name] = (images, labels)
      info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
      info.size = len(raw)
      tar.addfile(info, io.BytesIO(raw))
  return path, arrays


@pytest.fixture
def streamed_config():
  """Makes a tiny VGG config that streams host-size images (40 px, Inception-style crops to 32)."""
  from research import configuration

  def make(**overrides):
    config = configuration.load("configs/cifar_vgg.py:smoke")  # tiny VGG: fast to compile
    config.update(
      host_image_size=40,
      data_workers=0,
      prefetch=2,
      augment="inception_crop(32)|flip_lr|color_distort|scale(-1, 1)",
      eval_preprocess="central_crop(32)|scale(-1, 1)",
      batch_size=16,
      eval_batch_size=16,
    )
    config.update(overrides)
    return config

  return make


@pytest.fixture
def decoding_processes(monkeypatch, tmp_path_factory):
  """Records the process that decodes each image of a streamed run (tfds or image folder):
  gives a function of the split ("train", "eval") that returns their process ids, one an
  image, in the order they were decoded."""
  from research.data import streaming
  from tests.decoders import Recorded

  sources, logs = streaming.sources, tmp_path_factory.mktemp("decoders")

  def recorded(config, scanned):
    train, test, description, content = sources(config, scanned)
    train, test = Recorded(train, logs / "train.pids"), Recorded(test, logs / "eval.pids")
    return train, test, description, content

  monkeypatch.setattr(streaming, "sources", recorded)
  return lambda split: [int(x) for x in (logs / f"{split}.pids").read_text().split()]


@pytest.fixture
def nan_after_step(monkeypatch):
  """nan_after_step(n, seed=None): the run's step leaves NaN parameters behind in its n-th
  call (as an update that overflowed), in every seed or in the seed at index `seed` alone. The
  step is the run's usual program, compiled (or loaded) as any run's."""
  import jax

  from research import train

  def arm(n: int, seed: int | None = None):
    where = ... if seed is None else seed  # the step's state: on every device, seeds first
    poison = jax.pmap(
      lambda state: state.replace(
        params=jax.tree.map(lambda p: p.at[where].set(np.nan), state.params)
      )
    )
    compile_step = train._compiled_step

    def compiled_step(*args):
      step, calls = compile_step(*args), itertools.count(1)

      def diverging(state, batch):
        state, metrics = step(state, batch)
        return (poison(state) if next(calls) == n else state), metrics

      return diverging

    monkeypatch.setattr(train, "_compiled_step", compiled_step)

  return arm


@pytest.fixture
def guide_module(tmp_path):
  """docs/extending.md's file PATH imported as a module (tests/guide.py), its parts registered
  for the test alone."""
  from tests import guide

  with guide.registered():
    yield lambda path: guide.module(path, tmp_path)


@pytest.fixture
def x64():
  """JAX's 64-bit types on for the test (tests/float64.py): a float64 run's state, or a run's
  workdir trained in float64, is used."""
  from tests import float64

  with float64.on():
    yield
