"""The Keras `cifar10_cnn.py` example from the Keras multi-GPU write-up, done on device.

  ./launch.sh configs/cifar_keras_cnn.py
  ./launch.sh configs/cifar_keras_cnn.py:smoke
  ./launch.sh configs/cifar_keras_cnn.py:no_augment    # the write-up's baseline

Keras' recipe: RMSprop lr 1e-4 with legacy decay 1e-6 (lr / (1 + 1e-6 * step)), batch 32
per device, width/height shift 0.1 and horizontal flip (ImageDataGenerator), pixels scaled
to [0, 1], no standardization. The write-up ran it on 8 K80s: batch 32 × 8 = 256.
Keras reports ~75% test accuracy after 50 epochs, ~79% after 100 on real CIFAR-10.
"""

from configs.common import apply_variant, training_defaults


def _smoke(c):
  c.dataset = "synthetic"
  c.synthetic_train_size, c.synthetic_test_size = 1024, 250
  c.batch_size, c.eval_batch_size = 64, 64
  c.num_train_steps, c.log_every_steps = 24, 8
  c.learning_rate = 1e-3  # so the short run visibly learns
  # Less noise than the default 0.6: without BatchNorm this model has only begun to separate
  # those classes by step 24, and its eval accuracy there swings with float rounding: at 0.2
  # it stays well above chance on every device count, XLA optimization level and CPU kernel
  # measured (2026-11-26; in the history of BENCHMARKS.md).
  c.synthetic_noise = 0.2
  c.keep_freed_host_memory = False  # compile-bound (research/fields.py)


VARIANTS = {"smoke": _smoke, "no_augment": lambda c: c.update(augment="")}


def get_config(arg=None):
  c = training_defaults()
  c.model = dict(name="keras_cnn", num_classes=10, dtype="float32")
  c.batch_size = 256  # 32 per device on the write-up's 8 GPUs; global here
  c.num_epochs = 100
  c.optimizer, c.learning_rate, c.lr_batch_size = "rmsprop", 1e-4, 0  # no lr scaling
  c.rms_decay, c.rms_eps, c.rms_eps_in_sqrt = 0.9, 1e-7, False  # Keras 2 RMSprop
  c.momentum = 0.0  # Keras RMSprop has none
  c.schedule, c.lr_decay = "inverse_time", 1e-6
  c.augment = "shift(0.1)|flip_lr"
  c.eval_preprocess = ""
  c.eval_every_epochs = 10.0
  apply_variant(c, arg, VARIANTS)
  return c
