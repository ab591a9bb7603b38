"""Measurement records in results/ and the tables and plot rendered from them.

`./launch.sh report` writes one JSON record per measurement to
`results/<machine>/<part>-<name>.json`: the device, the versions, the config and the exact
command, the date, and the numbers. The README's summary, the full results table in
docs/results.md, BENCHMARKS.md's report tables and `docs/accuracy_vs_time.png` are rendered from
these records (`./launch.sh report --render`), between marker lines, so no number in them is
typed by hand; tests/tools/test_results.py fails when a table and the committed records disagree.
"""

import json
import re
from pathlib import Path

from research.errors import UserError

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "results"
RESULTS_PAGE = ROOT / "docs" / "results.md"  # the full table; the README shows a summary
PLOT = ROOT / "docs" / "accuracy_vs_time.png"
NOT_MEASURED = "not measured yet"


def load(results: Path = RESULTS) -> list[dict]:
  """Every record under `results`, sorted by part, name and machine."""
  records = [json.loads(p.read_text()) for p in sorted(Path(results).glob("*/*.json"))]
  return sorted(records, key=lambda r: (r["part"], r["name"], r["machine"]))


def record_path(machine_dir: Path, part: str, name: str) -> Path:
  """Where a machine's record of measurement `name` of `part` lives."""
  return Path(machine_dir) / f"{part}-{name}.json"


def write(record: dict, results: Path = RESULTS) -> Path:
  path = record_path(Path(results) / record["machine"], record["part"], record["name"])
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(record, indent=2) + "\n")
  return path


def machine_slug(device_kind: str, count: int, cpu_model: str, cores: int, platform: str) -> str:
  """`1x-nvidia-h100-80gb-hbm3`, or for CPU devices the host's processor and core count."""
  what = f"{cpu_model}-{cores}-cores" if platform == "cpu" else f"{count}x-{device_kind}"
  return re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")


def hardware(record: dict) -> str:
  """`1× NVIDIA H100 80GB HBM3` or `2-core AMD EPYC (1 CPU device)`."""
  d = record["device"]
  if d["platform"] == "cpu":
    return f"{d['host_cores']}-core {d['cpu_model']} ({d['count']} CPU device)"
  return f"{d['count']}× {d['kind']}"


def launch_curve(metrics: list[dict]) -> tuple[list, float]:
  """([(seconds, step, eval accuracy)], total seconds) over all launches of one workdir.

  `elapsed_sec` restarts at each launch (a resume); a launch's time runs from its first step
  to its last record, so compile and data loading are not in it.
  """
  curve, offset, previous = [], 0.0, 0.0
  for r in metrics:
    if "elapsed_sec" not in r:
      continue
    if r["elapsed_sec"] < previous:  # a new launch: the one before ended at `previous`
      offset += previous
    previous = r["elapsed_sec"]
    if "eval_accuracy" in r:
      curve.append((offset + previous, r["step"], r["eval_accuracy"]))
  return curve, offset + previous


def _duration(seconds: float) -> str:
  """`42 s`, `12 min 05 s`, `3 h 07 min`."""
  minutes, sec = divmod(round(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  if hours:
    return f"{hours} h {minutes:02d} min"
  return f"{minutes} min {sec:02d} s" if minutes else f"{sec} s"


def _row(cells) -> str:
  return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list]) -> str:
  lines = [_row(header), _row(["---"] * len(header)), *map(_row, rows)]
  return "\n".join(lines)


def _percent(x: float) -> str:
  return f"{x:.2%}".replace("%", " %")


def _recipe(name: str) -> str:
  """The recipe a measurement belongs to: runs named NAME-seedN differ only in their seed."""
  return re.sub(r"-seed\d+$", "", name)


def _recipe_label(entries: list[dict]) -> str:
  """'Speedrun (8 epochs), float32, seeds 0–2' for entries of one recipe and dtype."""
  label = re.sub(r", seed \d+$", "", entries[0]["label"]) + f", {entries[0]['dtype']}"
  seeds = sorted(int(m.group(1)) for e in entries if (m := re.search(r"seed (\d+)$", e["label"])))
  if len(seeds) == 1:
    return f"{label}, seed {seeds[0]}"
  if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f"{label}, seeds {seeds[0]}–{seeds[-1]}"
  return f"{label}, seeds {', '.join(map(str, seeds))}" if seeds else label


def _by_recipe(entries: list[dict], platform) -> list[list[dict]]:
  """`entries` grouped by recipe, dtype and `platform(entry)`, in order of first appearance."""
  groups: dict[tuple, list[dict]] = {}
  for e in entries:
    groups.setdefault((_recipe(e["name"]), e["dtype"], platform(e)), []).append(e)
  return list(groups.values())


def _command(group: list[dict]) -> str:
  """The command of a row: with several seeds, `--config.seed=SEED` and the seeds it takes."""
  command = group[0]["command"]
  if len(group) == 1:
    return f"`{command}`"
  found = (re.search(r"--config\.seed=(\d+)", e["command"]) for e in group)
  seeds = sorted(int(m.group(1)) for m in found if m)
  consecutive = len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1))
  listed = f"{seeds[0]}–{seeds[-1]}" if consecutive else ", ".join(map(str, seeds))
  command = re.sub(r"--config\.seed=\d+", "--config.seed=SEED", command)
  return f"`{command}` (SEED = {listed})"


def _accuracy(values: list) -> str:
  """One run's accuracy, or the mean ± the standard deviation (n - 1) of several seeds' (each
  value one run's, or a list: the seeds of one program's)."""
  values = [v for value in values for v in (value if isinstance(value, list) else [value])]
  if len(values) == 1:
    return _percent(values[0])
  mean = sum(values) / len(values)
  std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
  return f"mean {100 * mean:.2f} ± {100 * std:.2f} %"


def _seconds(values: list[float]) -> str:
  mean = sum(values) / len(values)
  if len(values) == 1:
    return f"{mean:.2f} s"
  std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
  return f"{mean:.2f} ± {std:.2f} s"


def _test_accuracy(numbers: list[dict], without: bool = True) -> str:
  """A row's test accuracy (the mean ± std of its seeds), with TTA where the runs used it, and
  then (`without`) the first view's alone."""
  accuracy = _accuracy([n["test_accuracy"] for n in numbers])
  if all("test_accuracy_first_view" in n for n in numbers):
    accuracy += " with TTA"
    if without:
      accuracy += f" ({_accuracy([n['test_accuracy_first_view'] for n in numbers])} without)"
  return accuracy


def _wall_time(numbers: list[dict]) -> str:
  """First step to final eval (the mean over seeds), the training alone where each seed trained
  in one launch, and a seed's share where several trained in one program."""
  wall_time = ("mean " if len(numbers) > 1 else "") + _duration(
    sum(n["wall_time_sec"] for n in numbers) / len(numbers)
  )
  if all("train_sec" in n for n in numbers):  # each trained in one launch
    wall_time += f" (training {sum(n['train_sec'] for n in numbers) / len(numbers):.1f} s)"
  if len(numbers) == 1 and "seeds" in numbers[0]:  # several seeds in one program
    n = numbers[0]
    wall_time += f", {n.get('train_sec', n['wall_time_sec']) / len(n['seeds']):.2f} s a seed"
  return wall_time


def _hardware_dates(group: list[dict]) -> str:
  dates = sorted({r["date"] for r in group})
  date = dates[0] if len(dates) == 1 else f"{dates[0]} – {dates[-1]}"
  return f"{hardware(group[0])}, {date}"


def _speedrun_peer_row(r: dict) -> list:
  """The speedrun against a PyTorch speedrun script, measured in one invocation on one GPU."""
  n = r["numbers"]
  peer = n.get("peer_title", "airbench94_muon")  # the only peer of records made before
  compile_sec = sum(n["compile_sec"]) / len(n["compile_sec"])
  return [
    f"{r['label']}, {r['dtype']}, {n['runs']} runs each",
    r["dataset"],
    f"ours {_accuracy(n['test_accuracy'])} with TTA, {peer} {_accuracy(n['peer_test_accuracy'])}",
    f"whitening init, training and TTA eval: ours {_seconds(n['span_sec'])} (training alone "
    f"{_seconds(n['train_sec'])}; compile {compile_sec:.0f} s apart), {peer} "
    f"{_seconds(n['peer_time_sec'])}; ours ÷ theirs {n['ratio']:.2f}",
    "",
    f"{hardware(r)}, {r['date']}",
    f"`{r['command']}`; {peer}: {_peer_script(n)}",
  ]


def _peer_script(numbers: dict) -> str:
  """The peer script that ran: its source at the pinned revision, or what is known of it."""
  script = numbers.get("peer_script")
  if not script:
    return "its revision not recorded"
  if script["revision"].startswith("unknown"):
    return f"not the pinned file (sha256 {script['sha256'][:12]}…)"
  return f"{script['source']} (sha256 {script['sha256'][:12]}…)"


def _speedrun_peer_summary(r: dict) -> list:
  """The speedrun against a PyTorch speedrun script, in the README's summary's columns."""
  n = r["numbers"]
  peer = n.get("peer_title", "airbench94_muon")
  return [
    f"{r['label']}, {r['dtype']}, {n['runs']} runs each",
    f"ours {_accuracy(n['test_accuracy'])}, {peer} {_accuracy(n['peer_test_accuracy'])} with TTA",
    f"span: ours {_seconds(n['span_sec'])}, {peer} {_seconds(n['peer_time_sec'])} "
    f"(ours ÷ theirs {n['ratio']:.2f})",
    _hardware_dates([r]),
  ]


def main_table(records: list[dict], expected: list[dict]) -> str:
  """docs/results.md's table: one row per trained recipe and machine (the seeds of one recipe share
  it: mean and standard deviation), and a 'not measured yet' row for the planned measurements
  (`expected`: {"name", "label", "hardware", "command"}) with no record on hardware of their
  kind."""
  header = ["config", "data", "test accuracy", "wall time", "examples/s", "hardware, date"]
  header.append("command")
  rows = []
  main = [r for r in records if r["part"] == "main"]
  for group in _by_recipe(main, lambda r: r["machine"]):
    numbers = [r["numbers"] for r in group]
    rows.append(
      [
        _recipe_label(group),
        group[0]["dataset"],
        _test_accuracy(numbers),
        _wall_time(numbers),
        f"{sum(n['examples_per_sec'] for n in numbers) / len(group):,.0f}",
        _hardware_dates(group),
        _command(group),
      ]
    )
  peers = [r for r in records if "peer_time_sec" in r["numbers"]]
  rows += [_speedrun_peer_row(r) for r in peers]
  missing = [
    e
    for e in expected
    if not any(
      r["name"] == e["name"] and r["device"]["platform"] == e["platform"] for r in main + peers
    )
  ]
  for group in _by_recipe(missing, lambda e: e["platform"]):
    e = group[0]
    rows.append(
      [_recipe_label(group), e["dataset"], NOT_MEASURED, "", "", e["hardware"], _command(group)]
    )
  return _table(header, rows)


def summary_table(records: list[dict]) -> str:
  """The README's summary: for each config, on the machine that trained it fastest, the latest
  measurement of each dtype (the seeds of one recipe share a row, as in the full table), and each
  speedrun against a peer. Every row, with its command, is in docs/results.md."""
  main = [r for r in records if r["part"] == "main"]
  fastest: dict[str, dict] = {}  # config -> its record of the most examples/s
  for r in main:
    best = fastest.get(r["config"])
    if best is None or r["numbers"]["examples_per_sec"] > best["numbers"]["examples_per_sec"]:
      fastest[r["config"]] = r
  groups = _by_recipe(main, lambda r: r["machine"])

  def rank(index: int) -> tuple:  # the latest; on a tie, the most seeds
    return max(r["date"] for r in groups[index]), len(groups[index])

  chosen: dict[tuple, int] = {}  # (config, dtype) -> the index of its group in `groups`
  for index, group in enumerate(groups):
    config, dtype = group[0]["config"], group[0]["dtype"]
    if group[0]["machine"] != fastest[config]["machine"]:
      continue
    if (config, dtype) not in chosen or rank(index) > rank(chosen[config, dtype]):
      chosen[config, dtype] = index
  rows = []
  for group in (groups[index] for index in sorted(chosen.values())):
    numbers = [r["numbers"] for r in group]
    rows.append(
      [
        _recipe_label(group),
        _test_accuracy(numbers, without=False),
        _wall_time(numbers),
        _hardware_dates(group),
      ]
    )
  rows += [_speedrun_peer_summary(r) for r in records if "peer_time_sec" in r["numbers"]]
  return _table(["config", "test accuracy", "wall time", "hardware, date"], rows)


# Why the throughput part's search for the largest global batch ended (a record's `search_end`)
SEARCH_ENDS = {
  "memory": "the largest that fits",
  "limit": "the largest the search tries",
  "budget": "the largest timed before the budget ran out",
}


def _speed(numbers: dict) -> str:
  """Examples/s, with the range of its timings where it is the median of several."""
  text = f"{numbers['examples_per_sec']:,.1f}"
  if rounds := numbers.get("examples_per_sec_rounds"):
    text += f" ({min(rounds):,.0f}–{max(rounds):,.0f} in {len(rounds)} timings)"
  return text


def throughput_table(records: list[dict]) -> str:
  rows = []
  for r in (r for r in records if r["part"] == "throughput"):
    n = r["numbers"]
    mfu = f"{n['mfu']:.1%}" if n.get("mfu") is not None else "n/a"
    ended = f" ({SEARCH_ENDS[r['search_end']]})" if "search_end" in r else ""
    rows.append(
      [
        r["label"],
        r["dtype"],
        f"{n['batch_size']}{ended}",
        _speed(n),
        f"{n['flops_per_step'] / 1e9:,.1f}",
        mfu,
        f"{n['peak_tflops']:.4g} ({n['peak_source']})",
        f"{hardware(r)}, {r['date']}",
      ]
    )
  header = ["config", "dtype", "global batch", "examples/s", "GFLOP/step", "MFU"]
  header += ["peak TFLOP/s (source)", "hardware, date"]
  return _table(header, rows)


def peer_table(records: list[dict]) -> str:
  rows = []
  for r in (r for r in records if r["part"] == "peer" and "peer_examples_per_sec" in r["numbers"]):
    n = r["numbers"]
    rows.append(
      [
        r["label"],
        r["dtype"],
        n["batch_size"],
        _speed(n),
        _speed(n["peer"]),
        f"{n['ratio']:.2f}",
        f"PyTorch {r['versions'].get('torch', '?')}, {hardware(r)}, {r['date']}",
      ]
    )
  header = ["network", "dtype", "global batch", "ours ex/s", "PyTorch ex/s", "ours ÷ PyTorch"]
  return _table([*header, "versions, hardware, date"], rows)


def streamed_table(records: list[dict]) -> str:
  rows = []
  for r in (r for r in records if r["part"] == "streamed"):
    n = r["numbers"]
    rows.append(
      [
        r["label"],
        n["data_workers"],
        n["batch_size"],
        f"{n['examples_per_sec']:,.1f}",
        f"{n['input_wait_fraction']:.1%}",
        f"{n['decode_images_per_sec_per_worker']:,.0f}",
        f"{hardware(r)}, {r['date']}",
      ]
    )
  header = ["config", "decode workers", "global batch", "examples/s", "input wait"]
  return _table([*header, "decodes/s per worker", "hardware, date"], rows)


def plot(records: list[dict], path: Path = PLOT) -> None:
  """Test accuracy against wall time for each measured run (its eval curve)."""
  import matplotlib
  import matplotlib.ticker

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  runs = [r for r in records if r["part"] == "main"]
  groups = _by_recipe(runs, lambda r: r["machine"])
  fig, ax = plt.subplots(figsize=(7, 4 + 0.16 * len(groups)))  # the legend below the axes
  for color, group in enumerate(groups):
    for i, r in enumerate(group):  # the seeds of one recipe: one colour, one legend entry
      minutes = [t / 60 for t, _, _ in r["curve"]]
      label = f"{_recipe_label(group)}, {hardware(r)}" if i == 0 else None
      accuracy = [a for _, _, a in r["curve"]]
      ax.plot(minutes, accuracy, "o-", color=f"C{color}", ms=3, alpha=0.8, label=label)
  ax.set(xlabel="wall time (minutes)", ylabel="test accuracy", title="Accuracy against time")
  if runs:
    ax.set_xscale("log")  # GPU runs take minutes, CPU runs hours
    plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
    ax.xaxis.set_major_formatter(plain)

    def sparse(value, _):  # minor ticks labelled at 2 and 5 × 10^k: more would crowd
      text = f"{value:g}"
      return text if text.lstrip("0.")[:1] in ("2", "5") else ""

    ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(sparse))
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.14), frameon=False)
  else:
    ax.text(0.5, 0.5, "no run measured yet", ha="center", transform=ax.transAxes)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120, metadata={"Software": None})
  plt.close(fig)


def replace_between(text: str, name: str, content: str) -> str:
  """`text` with the lines between `<!-- NAME -->` and `<!-- /NAME -->` set to `content`."""
  start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
  if start not in text or end not in text:
    raise UserError(f"the lines {start} and {end} that hold a table are gone; restore them (git)")
  head, rest = text.split(start, 1)
  _, tail = rest.split(end, 1)
  return f"{head}{start}\n{content}\n{end}{tail}"


def rendered(records: list[dict], expected: list[dict]) -> dict[Path, str]:
  """{file: its text with the tables rendered from `records`}: README.md (the summary),
  docs/results.md (every measurement) and BENCHMARKS.md."""
  readme = (ROOT / "README.md").read_text()
  readme = replace_between(readme, "results-summary", summary_table(records))
  page = replace_between(RESULTS_PAGE.read_text(), "results", main_table(records, expected))
  bench = (ROOT / "BENCHMARKS.md").read_text()
  for name, table in (
    ("throughput", throughput_table),
    ("peer", peer_table),
    ("streamed", streamed_table),
  ):
    bench = replace_between(bench, name, table(records))
  return {ROOT / "README.md": readme, RESULTS_PAGE: page, ROOT / "BENCHMARKS.md": bench}
