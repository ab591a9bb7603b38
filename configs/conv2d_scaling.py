"""The 2017 `tf.nn.conv2d` multi-GPU write-up, each part timed separately (no training).

  ./launch.sh configs/conv2d_scaling.py                # the write-up's workload on 1..N devices
  ./launch.sh configs/conv2d_scaling.py:big_filter     # its hypothesis: 10x10 filter
  ./launch.sh configs/conv2d_scaling.py:channels       # its hypothesis: 10 channels in and out
  ./launch.sh configs/conv2d_scaling.py:weak           # 840 images per device, not in total
  ./launch.sh configs/conv2d_scaling.py:large          # enough work per call for devices to win
  ./launch.sh configs/conv2d_scaling.py:smoke          # tiny, seconds on CPU
  ./launch.sh configs/conv2d_scaling.py:big_filter,channels --config.device_counts='(1,2,4,8)'

The write-up: 840 single-channel 100x100 float32 images, a 3x3 filter of ones, SAME
padding, split evenly over 1-8 GPUs; one timer around a single cold `sess.run` gave
14.9 s on one V100 and ~0.7 s on 4-8, against 0.22 s for scipy.signal.convolve2d in a
Python loop on one CPU core. research/experiments/conv2d_scaling.py says what is timed.
"""

from configs.common import apply_variant
from research.experiments import conv2d_scaling


def _smoke(c):
  c.num_images, c.image_size = 20, 16  # 20: not divisible by 3, 6, 7, 8 (padding is exercised)
  c.filter_init = "random"  # a non-symmetric filter, so the scipy check sees orientation
  c.repeats = 2


def _large(c):
  c.num_images, c.image_size = 256, 128
  c.in_channels, c.out_channels = 32, 32  # 77 GFLOP per pass instead of 0.15
  c.repeats = 10
  c.scipy_baseline = False  # 32 x 32 scipy calls per image, 262,144 in all: minutes


VARIANTS = {
  "smoke": _smoke,
  "big_filter": lambda c: c.update(filter_size=10),
  "channels": lambda c: c.update(in_channels=10, out_channels=10),
  "weak": lambda c: c.update(mode="weak"),
  "large": _large,
}


def get_config(arg=None):
  c = conv2d_scaling.defaults()  # every field, with its unit: research/experiments/
  apply_variant(c, arg, VARIANTS)
  return c
