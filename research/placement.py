"""Placement: arrays between the host and the pmapped devices, in one or many processes, and
the barriers that keep the processes of a run in step.

`AXIS` is the one pmap axis: every lax.pmean/psum and every BatchNorm names it. 'batch', as
flax's examples name theirs: a model copied from them runs as written.
"""

import gc
import hashlib
import itertools
import json

import jax
import numpy as np

AXIS = "batch"


def to_devices(local, devices=None):
  """This process's rows of a pmapped array ([local_devices, ...]) as one global jax.Array.

  pmap takes arrays sharded over its devices along the leading axis; building the global
  array explicitly lets the same code (and the AOT-compiled step) serve one or many processes.
  """
  mesh = jax.sharding.Mesh(np.array(devices or jax.devices()), (AXIS,))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS))
  return jax.make_array_from_process_local_data(sharding, np.ascontiguousarray(local))


def upload_shards(arrays, per_device: int, rows=None):
  """Puts this process's blocks of `arrays` on its devices: [devices, per_device, ...].

  Device d (of all processes') holds rows d * per_device, ... of the arrays as `rows` (an
  index array) orders them; None keeps their order.
  """
  n_local = jax.local_device_count()
  start = jax.process_index() * n_local * per_device
  take = slice(start, start + n_local * per_device)
  blocks = (a[take] if rows is None else a[rows[take]] for a in arrays)
  on_devices = tuple(to_devices(b.reshape(n_local, per_device, *b.shape[1:])) for b in blocks)
  if rows is not None:  # a whole split's host copies: freed now, should a reference cycle hold
    gc.collect()  # them (a full collection: a second or more in a process with a large heap)
  return on_devices


def upload_whole(arrays):
  """Puts the whole of each of `arrays` on every device: [devices, n, ...], one host-to-device
  copy per local device from the same host array (no host copy per device)."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()), (AXIS,))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS))

  def whole(a):
    one = np.ascontiguousarray(a)[None]  # [1, n, ...]: a view
    copies = [jax.device_put(one, d) for d in jax.local_devices()]
    return jax.make_array_from_single_device_arrays(
      (jax.device_count(), *a.shape), sharding, copies
    )

  return tuple(whole(a) for a in arrays)


def replicate(tree, devices=None):
  """One copy per device (default: all), laid out as pmap expects: [devices, ...]."""
  n_local = len(devices) if devices else jax.local_device_count()
  return jax.tree.map(
    lambda x: to_devices(np.broadcast_to(x, (n_local, *np.shape(x))), devices), tree
  )


def first_replica(tree):
  """The copy on this process's first device, fetched to host (no cross-device gather): all
  leaves' copies start at once, then are awaited."""
  on_device = jax.tree.map(lambda x: x.addressable_shards[0].data, tree)
  return jax.tree.map(lambda x: x[0], jax.device_get(on_device))


def same_in_every_process(value) -> bool:
  """Whether `value` (what JSON writes) is the same in every process of the run: one
  all-gather of a 4-byte digest; at once True for one process."""
  if jax.process_count() == 1:
    return True
  digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()
  digests = gather_processes(np.frombuffer(digest[:4], np.int32)[0])
  return len(set(digests.tolist())) == 1


_GATHERS = itertools.count()  # names each gather's barrier: every process gathers in one order


def _identity(x):
  return x


def gather_processes(value) -> np.ndarray:
  """[processes, ...]: every process's `value` (of one shape and dtype in all), as
  `multihost_utils.process_allgather` gives it, but returned only once every device of every
  process has run the gather. process_allgather waits for this process's first device alone:
  a process that then exits (on an error that every process raises from what it gathered)
  can leave a device of another process still connecting to it, whose own exit then hangs
  (found by tests/test_multiprocess.py)."""
  devices = np.asarray(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
  mesh = jax.sharding.Mesh(devices, ("processes", "local"))
  spec = jax.sharding.PartitionSpec
  rows = jax.sharding.NamedSharding(mesh, spec("processes"))
  local = jax.make_array_from_process_local_data(rows, np.asarray(value)[None])
  everywhere = jax.sharding.NamedSharding(mesh, spec())
  gathered = jax.jit(_identity, out_shardings=everywhere)(local).block_until_ready()
  wait_for_all(f"gathered-{next(_GATHERS)}")  # and every other process's devices too
  return np.asarray(gathered.addressable_data(0))


def wait_for_all(name: str, timeout_sec: int = 1800) -> None:
  """Every process reaches this point before any goes on, through jax.distributed's service
  (no collective: the first collective of a set of devices gives up after 30 s if a process
  is that late, as one that compiles slower or without a cached program is)."""
  if jax.process_count() > 1:
    from jax._src import distributed  # its client; JAX offers no public barrier without devices

    distributed.global_state.client.wait_at_barrier(name, timeout_sec * 1000)
