"""One conv2d over 1..N devices, each part timed on its own, against scipy on one CPU core.

  ./launch.sh configs/conv2d_scaling.py[:variant]

The 2017 write-up put one timer around a single cold `sess.run` of `tf.nn.conv2d` split
over 1-8 GPUs, so its numbers mixed one-time costs with the conv. Here, for every device
count k, `lax.conv_general_dilated` runs inside `jax.pmap` over the first k local devices
(one shard of images per device, zero images padding the count to a multiple of k and
dropped afterwards) and these are timed separately with time.perf_counter:
  compile_s     trace, lower and compile a fresh pmapped function
  h2d_s         host -> device copy of the sharded images (median of `repeats`)
  compute_s     one call on device-resident images, block_until_ready (median)
  d2h_s         device -> host copy of the result, np.asarray (median)
  cold_total_s  the write-up's timer: host images to host result in one first call of a
                fresh function with JAX's caches cleared, so compile is included
  scipy_s       the write-up's CPU baseline: a Python loop of scipy.signal 2-D calls
The scipy loop also checks the result (max_abs_err). Writes WORKDIR/conv2d_scaling.csv
and WORKDIR/conv2d_scaling.png, prints the table and a short reading.
"""

import csv
import functools
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax import lax

from research import fields as fields_lib
from research.errors import UserError
from research.placement import to_devices

MODES = ("strong", "weak")
DTYPES = ("float32", "bfloat16", "float16")
PADDINGS = ("SAME", "VALID")
FILTER_INITS = ("ones", "random")
SIZES = ("num_images", "image_size", "in_channels", "out_channels", "filter_size", "repeats")
PARTS = ("compile_s", "h2d_s", "compute_s", "d2h_s")
WORKLOAD = ("image_size", "in_channels", "out_channels", "filter_size", "padding", "dtype")
COLUMNS = [
  "n_devices",
  "mode",
  "n_images",
  "per_device_images",
  *PARTS,
  "cold_total_s",
  "scipy_s",
  "max_abs_err",
  "speedup",
  "efficiency",
  "cold_speedup",
  *WORKLOAD,
  "device_kind",
  "jax_version",
]


def defaults() -> ml_collections.ConfigDict:
  """The experiment's fields, each with its default: its config starts from these
  (configs/conv2d_scaling.py), and a field it does not declare is an error (`check_config`)."""
  c = ml_collections.ConfigDict()
  c.experiment = "conv2d_scaling"  # this module
  c.modules = ()  # Python modules imported first (as a training config's)
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
  return c


# What make_inputs reads of the config.
INPUTS = (
  "seed",
  "image_size",
  "in_channels",
  "out_channels",
  "filter_size",
  "filter_init",
  "dtype",
)


def _choice(field: str, value, choices: tuple) -> None:
  if value not in choices:
    raise UserError(f"{field}={value!r} is unknown; use one of {', '.join(choices)}")


def check_config(config, n_local: int) -> list[int]:
  """Raises UserError for a workload that cannot run, before anything compiles (a field the
  experiment does not declare among them); returns k's."""
  known = list(defaults())
  for field in config:
    if field not in known:
      raise UserError(
        f"{field}: no part of this experiment reads it{fields_lib.nearest(field, known)}"
      )
  for field in SIZES:
    value = config[field]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise UserError(f"{field}={value!r} must be a whole number of 1 or more")
  choices = {"mode": MODES, "dtype": DTYPES, "padding": PADDINGS, "filter_init": FILTER_INITS}
  for field, allowed in choices.items():
    _choice(field, config[field], allowed)
  if config.padding == "VALID" and config.filter_size > config.image_size:
    raise UserError(
      f"filter_size={config.filter_size} is larger than image_size={config.image_size}, so "
      "padding='VALID' leaves no output; use a smaller filter_size or padding='SAME'"
    )
  counts = config.device_counts or tuple(range(1, n_local + 1))
  if any(isinstance(k, bool) or not isinstance(k, int) or k <= 0 for k in counts):
    raise UserError(f"device_counts={counts} must hold positive whole numbers, e.g. (1, 2, 4)")
  if max(counts) > n_local:
    raise UserError(
      f"device_counts={counts} asks for {max(counts)} devices but jax.local_device_count() "
      f"is {n_local}; use counts up to {n_local}, or device_counts=() for 1..{n_local}"
    )
  return sorted(set(counts))


def make_inputs(fields, n_images: int) -> tuple[np.ndarray, np.ndarray]:
  """Images [n, H, W, C_in] uniform in [0, 1) and the filter [fh, fw, C_in, C_out] (`fields`:
  INPUTS)."""
  rng = np.random.default_rng(fields.seed)
  size, f = fields.image_size, fields.filter_size
  images = rng.random((n_images, size, size, fields.in_channels), dtype=np.float32)
  kernel_shape = (f, f, fields.in_channels, fields.out_channels)
  kernel = np.ones(kernel_shape, np.float32)
  if fields.filter_init == "random":
    kernel = rng.standard_normal(kernel_shape, dtype=np.float32)
  dtype = jnp.dtype(fields.dtype)
  return images.astype(dtype), kernel.astype(dtype)


def conv(images, kernel, padding: str):
  """One device's images [n, H, W, C_in] -> [n, H', W', C_out], as tf.nn.conv2d computes."""
  return lax.conv_general_dilated(
    images, kernel, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
  )


def fresh_p_conv(kernel, padding: str, devices):
  """A new pmapped conv: a new function object, so JAX has nothing compiled for it yet."""
  return jax.pmap(functools.partial(conv, kernel=kernel, padding=padding), devices=devices)


def shard(images: np.ndarray, k: int) -> np.ndarray:
  """[n, H, W, C] -> [k, ceil(n / k), H, W, C]; zero images fill the last shards.

  The buffer is 64-byte aligned: XLA's CPU backend then aliases it instead of copying, so
  h2d does not depend on where numpy happened to allocate (on GPUs it is always a copy).
  """
  per_device = -(-len(images) // k)
  shape = (k, per_device, *images.shape[1:])
  nbytes = int(np.prod(shape)) * images.itemsize
  raw = np.empty(nbytes + 64, np.uint8)
  start = -raw.ctypes.data % 64
  shards = raw[start : start + nbytes].view(images.dtype).reshape(shape)
  flat = shards.reshape(-1, *images.shape[1:])  # a view: [k * per_device, H, W, C]
  flat[: len(images)], flat[len(images) :] = images, 0
  return shards


def unshard(out: np.ndarray, n_images: int) -> np.ndarray:
  """[k, per_device, H', W', C] -> [n_images, H', W', C], padding images dropped."""
  return out.reshape(-1, *out.shape[2:])[:n_images]


def time_cold(images, kernel, padding: str, devices) -> tuple[float, np.ndarray]:
  """The write-up's measurement: one timer from host images to host result, compile included."""
  jax.clear_caches()
  p_conv = fresh_p_conv(kernel, padding, devices)
  start = time.perf_counter()
  out = unshard(np.asarray(p_conv(to_devices(shard(images, len(devices)), devices))), len(images))
  return time.perf_counter() - start, out


def time_parts(images, kernel, padding: str, devices, repeats: int) -> dict:
  """Compile once, then `repeats` x (copy in, compute on resident images, copy out): medians."""
  shards = shard(images, len(devices))  # [k, per_device, H, W, C_in]
  x = to_devices(shards, devices).block_until_ready()
  start = time.perf_counter()
  p_conv = fresh_p_conv(kernel, padding, devices).lower(x).compile()
  compile_s = time.perf_counter() - start
  p_conv(x).block_until_ready()  # one untimed call: first-run allocations are not steady state
  times = {part: [] for part in PARTS[1:]}
  for _ in range(repeats):
    start = time.perf_counter()
    x = to_devices(shards, devices).block_until_ready()
    times["h2d_s"].append(time.perf_counter() - start)
    start = time.perf_counter()
    out = p_conv(x).block_until_ready()  # [k, per_device, H', W', C_out]
    times["compute_s"].append(time.perf_counter() - start)
    start = time.perf_counter()
    np.asarray(out)  # a new result each time: jax.Array caches its host copy
    times["d2h_s"].append(time.perf_counter() - start)
  return {"compile_s": compile_s, **{p: statistics.median(t) for p, t in times.items()}}


def scipy_conv(images: np.ndarray, kernel: np.ndarray, padding: str) -> np.ndarray:
  """The write-up's CPU baseline: a Python loop of 2-D scipy calls, one per channel pair.

  correlate2d, because convolve2d flips the filter (the same for the write-up's ones filter).
  """
  import scipy.signal  # the tools extra (environment.PLOTS), checked before the run

  images, kernel = images.astype(np.float32), kernel.astype(np.float32)
  mode = padding.lower()  # scipy's "same" centres even filters as XLA's SAME does
  c_in, c_out = kernel.shape[2:]
  return np.stack(
    [
      np.stack(
        [
          sum(scipy.signal.correlate2d(image[..., i], kernel[..., i, o], mode) for i in range(c_in))
          for o in range(c_out)
        ],
        axis=-1,
      )
      for image in images
    ]
  )  # [n, H', W', C_out]


def time_scipy(images, kernel, padding: str) -> tuple[float, np.ndarray]:
  start = time.perf_counter()
  reference = scipy_conv(images, kernel, padding)
  return time.perf_counter() - start, reference


def measure(config, k: int, n_images: int, scipy_cache: dict) -> dict:
  """Every timing for k devices; scipy runs once per image count and is reused."""
  images, kernel = make_inputs(fields_lib.reading(config, INPUTS, __name__), n_images)
  devices = jax.local_devices()[:k]
  cold_s, out = time_cold(images, kernel, config.padding, devices)
  parts = time_parts(images, kernel, config.padding, devices, config.repeats)
  scipy_s = max_abs_err = None
  if config.scipy_baseline:
    if n_images not in scipy_cache:
      scipy_cache[n_images] = time_scipy(images, kernel, config.padding)
    scipy_s, reference = scipy_cache[n_images]
    max_abs_err = float(np.abs(out.astype(np.float32) - reference).max())
  return {
    "n_devices": k,
    "mode": config.mode,
    "n_images": n_images,
    "per_device_images": -(-n_images // k),
    **parts,
    "cold_total_s": cold_s,
    "scipy_s": scipy_s,
    "max_abs_err": max_abs_err,
    **{field: config[field] for field in WORKLOAD},
    "device_kind": devices[0].device_kind,
    "jax_version": jax.__version__,
  }


def add_speedups(rows: list[dict]) -> None:
  """Speedup in images/s over the fewest devices measured (steady compute, and cold)."""
  base = rows[0]
  for r in rows:
    r["speedup"] = (r["n_images"] / r["compute_s"]) / (base["n_images"] / base["compute_s"])
    r["cold_speedup"] = (r["n_images"] / r["cold_total_s"]) / (
      base["n_images"] / base["cold_total_s"]
    )
    r["efficiency"] = r["speedup"] / (r["n_devices"] / base["n_devices"])


def _ms(seconds) -> str:
  return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def print_table(rows: list[dict]) -> None:
  print(
    f"\n{'devices':>7} {'images':>6} {'per dev':>7} {'compile ms':>10} {'h2d ms':>8} "
    f"{'compute ms':>10} {'d2h ms':>8} {'cold ms':>9} {'speedup':>7} {'effic.':>6} "
    f"{'cold spd':>8} {'scipy ms':>9} {'max err':>8}"
  )
  for r in rows:
    err = "-" if r["max_abs_err"] is None else f"{r['max_abs_err']:.1e}"
    print(
      f"{r['n_devices']:7d} {r['n_images']:6d} {r['per_device_images']:7d} "
      f"{_ms(r['compile_s']):>10} {_ms(r['h2d_s']):>8} {_ms(r['compute_s']):>10} "
      f"{_ms(r['d2h_s']):>8} {_ms(r['cold_total_s']):>9} {r['speedup']:7.2f} "
      f"{r['efficiency']:6.0%} {r['cold_speedup']:8.2f} {_ms(r['scipy_s']):>9} {err:>8}"
    )


def reading(rows: list[dict]) -> list[str]:
  """A few plain sentences on what the table shows."""
  lines = []
  for r in {r["n_devices"]: r for r in (rows[0], rows[-1])}.values():
    top = max(PARTS, key=r.get)
    share = r[top] / r["cold_total_s"]
    apart = ", as the parts are timed in runs of their own" if share > 1 else ""
    lines.append(
      f"{r['n_devices']} device(s): the cold first call (the write-up's timer) took "
      f"{_ms(r['cold_total_s'])} ms; its largest part is {top[:-2]} at {_ms(r[top])} ms "
      f"({share:.0%} of it{apart}); steady compute is {_ms(r['compute_s'])} ms."
    )
  best = max(rows, key=lambda r: r["speedup"])
  lines.append(
    f"best steady-compute speedup: {best['speedup']:.2f}x on {best['n_devices']} devices "
    f"({best['efficiency']:.0%} efficiency) over {rows[0]['n_devices']} device(s)."
  )
  if rows[0]["scipy_s"] is not None:
    for r in {r["n_devices"]: r for r in (rows[0], best)}.values():
      lines.append(
        f"scipy loop on one core / lax.conv on {r['n_devices']} device(s): "
        f"{r['scipy_s'] / r['compute_s']:.3g}x steady, {r['scipy_s'] / r['cold_total_s']:.3g}x "
        "cold (above 1: the devices are faster)."
      )
    lines.append(f"max |lax.conv - scipy| over all rows: {max(r['max_abs_err'] for r in rows):.1e}")
  n_local, cores = jax.local_device_count(), os.cpu_count()
  if jax.default_backend() == "cpu" and n_local > (cores or n_local):
    lines.append(
      f"these {n_local} devices are XLA host devices sharing {cores} CPU cores: past "
      f"{cores} devices there is no more compute to split the work over."
    )
  return lines


def plot(rows: list[dict], path: Path, title: str) -> None:
  """Time components per device count (log scale) and speedup against ideal."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  n = np.array([r["n_devices"] for r in rows])
  fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [3, 2]})
  bars = {
    "compile_s": "compile",
    "h2d_s": "host -> device",
    "compute_s": "compute (steady)",
    "d2h_s": "device -> host",
    "cold_total_s": "cold first call (write-up's timer)",
  }
  width, x = 0.8 / len(bars), np.arange(len(rows))
  for i, (part, label) in enumerate(bars.items()):
    offset = (i - (len(bars) - 1) / 2) * width
    ax_t.bar(x + offset, [r[part] * 1e3 for r in rows], width, label=label)
  if rows[0]["scipy_s"] is not None:
    ax_t.plot(x, [r["scipy_s"] * 1e3 for r in rows], "k_", ms=30, mew=2)
    ax_t.plot([], [], "k_", ms=12, mew=2, label="scipy loop, 1 CPU core")
  ax_t.set(yscale="log", xlabel="devices", ylabel="ms (log scale)", title="time per part")
  ax_t.set_xticks(x, [str(k) for k in n])
  ax_t.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))
  ax_t.grid(axis="y", which="both", alpha=0.3)
  ax_s.plot(n, [r["speedup"] for r in rows], "o-", label="steady compute")
  ax_s.plot(n, [r["cold_speedup"] for r in rows], "s--", label="cold first call")
  ax_s.plot(n, n / n[0], "k:", label="ideal")
  ax_s.set(xlabel="devices", ylabel=f"speedup over {n[0]} device(s)", title="speedup")
  ax_s.set_xticks(n)
  ax_s.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)
  ax_s.grid(alpha=0.3)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_csv(rows: list[dict], path: Path) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, COLUMNS)
    writer.writeheader()
    writer.writerows(rows)


def describe(config) -> str:
  c, s = config, config.image_size
  images = f"{c.num_images} images" + (" per device" if c.mode == "weak" else "")
  return (
    f"{images}, {s}x{s}x{c.in_channels} -> {c.out_channels} ch, {c.filter_size}x"
    f"{c.filter_size} {c.filter_init} filter, {c.padding}, {c.dtype}, {c.mode} scaling; "
    f"{jax.local_device_count()} x {jax.local_devices()[0].device_kind} "
    f"({jax.default_backend()}, {os.cpu_count()} CPU cores), jax {jax.__version__}"
  )


def run(config, workdir: str) -> list[dict]:
  """Measures every device count, writes the CSV and the plot, prints table and reading."""
  counts = check_config(config, jax.local_device_count())
  print(f"conv2d_scaling: {describe(config)}", flush=True)
  # The process's one-time costs (backend start, first compile, first transfer), paid untimed
  # here so that every device count's cold time holds only what its own first call costs.
  inputs = make_inputs(fields_lib.reading(config, INPUTS, __name__), jax.local_device_count())
  time_cold(*inputs, config.padding, jax.local_devices())
  rows, scipy_cache = [], {}
  for k in counts:
    n_images = config.num_images * (k if config.mode == "weak" else 1)
    print(f"  {k} device(s), {n_images} images ...", flush=True)
    rows.append(measure(config, k, n_images, scipy_cache))
  add_speedups(rows)
  workdir = Path(workdir)
  write_csv(rows, workdir / "conv2d_scaling.csv")
  plot(rows, workdir / "conv2d_scaling.png", describe(config))
  print_table(rows)
  print("\n" + "\n".join(reading(rows)))
  if not config.scipy_baseline:
    print("scipy baseline off (scipy_baseline=False): results were not checked against scipy")
  print(f"\nwrote {workdir / 'conv2d_scaling.csv'} and {workdir / 'conv2d_scaling.png'}")
  return rows
