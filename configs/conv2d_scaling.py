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

import ml_collections

from configs.common import apply_variant


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
  c = ml_collections.ConfigDict()
  c.experiment = "conv2d_scaling"  # research/experiments/conv2d_scaling.py
  c.num_images = 840  # in total ("strong") or per device ("weak"); 840 = lcm(1, ..., 8)
  c.image_size = 100  # pixels per side of the square images
  c.in_channels = 1
  c.out_channels = 1
  c.filter_size = 3  # pixels per side of the square filter
  c.filter_init = "ones"  # "ones" as the write-up, or "random" (normal) to check orientation
  c.padding = "SAME"  # "SAME" (output as large as the input) or "VALID"
  c.dtype = "float32"  # of images and filter: "float32", "bfloat16" or "float16"
  c.mode = "strong"  # "strong": num_images split over the devices; "weak": num_images each
  c.device_counts = ()  # () = 1, 2, ..., all local devices; or e.g. (1, 2, 4, 8)
  c.repeats = 20  # steady-state calls and copies per device count; medians are reported
  c.seed = 0  # image values: uniform in [0, 1) (the write-up used ones; timing is the same)
  c.scipy_baseline = True  # time scipy.signal.correlate2d in a loop on one core; check results
  apply_variant(c, arg, VARIANTS)
  return c
