"""The performance page: fedlib's engines against Flower and a centralized epoch (``benchmarks/peers.py``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from ...events import report
from ...models import build_model
from ...provenance import repo_root
from ..kit.items import work
from ..kit.pages import measured_benchmark
from ..kit.sources import load_profile
from ..kit.stored import StoredIndex
from ..kit.tables import Table
from .celm import protocol as celm_protocol
from .base import Chapter

ENGINE_LABELS = {"vectorized": "fedlib vectorized", "loop": "fedlib loop", "flower": "Flower (simulation)",
                 "central": "centralized epoch"}
ROUND_PARTS = {"train_s": "local training", "eval_s": "evaluation", "server_s": "server step",
               "overhead_s": "Python overhead"}
VALUATION_COLUMNS = {"server_s": ("server s / round", "{:.3f}"), "ratio": ("× FedAvg round", "{:.2f}x"),
                     "flops": ("GFLOP / round", "{:.3f}"), "arithmetic_s": ("arithmetic s", "{:.4f}"),
                     "multiple": ("× arithmetic", "{:.1f}x")}  # record key -> (column, format)
NOT_MEASURED = "not measured in this profile"
STORED_CPU_RUN = "peers-cpu-2core.json"  # benchmarks/results/: the evidence build's "live" run (nothing is timed)
LOAD_MARGIN = 0.5  # a 1-minute load average above cores + this, before or after an engine: other work competed


def competed(load: dict[str, Any] | None) -> bool:
    """Whether other work competed for the CPU while an engine was timed: the 1-minute load average before
    or after it exceeded the cores (the benchmark plans one compute thread per core) by more than LOAD_MARGIN."""
    return bool(load) and max(load["before"], load["after"]) > load["cores"] + LOAD_MARGIN


def merge_runs(runs: list[dict]) -> dict:
    """One benchmark record from one invocation per engine: the first's provenance, every engine's columns
    per N, the breakdown and valuation of the invocation that has them, and each engine's load."""
    merged = {k: v for k, v in runs[0].items() if k not in ("rows", "load")}
    rows: dict[int, dict] = {}
    for run in runs:
        for row in run["rows"]:
            rows.setdefault(row["N"], {}).update(row)
        merged |= {k: run[k] for k in ("breakdown", "valuation", "valuation_clients") if run.get(k)}
    merged["rows"] = [rows[n] for n in sorted(rows)]
    merged["load"] = {run["engine"]: run["load"] for run in runs if run.get("load")}
    return merged


def live_text(run: dict, stored: str = "") -> str:
    """The live run's verdict as sentences that read right whatever was timed; no verdict (and why) when
    other work competed for the CPU during any engine."""
    busy = {e: load for e, load in (run.get("load") or {}).items() if competed(load)}
    if busy:
        worst = max(max(load["before"], load["after"]) for load in busy.values())
        cores = next(iter(busy.values()))["cores"]
        return (f"No verdict: other work competed for the CPU while {', '.join(ENGINE_LABELS[e] for e in busy)} "
                f"ran (1-minute load average up to {worst:.1f} on {cores} cores, before and after each engine: "
                + "; ".join(f"{ENGINE_LABELS[e]} {ld['before']:.1f} → {ld['after']:.1f}"
                            for e, ld in run["load"].items())
                + "). The times above are as measured; ratios between engines are not comparable on a shared "
                "machine. Rebuild this page on a quiet machine for a verdict.")
    flower, loop = ratios(run, "flower"), ratios(run, "loop")
    central = ratios(run, "vectorized", "central")
    parts = []
    if flower:
        faster = "faster" if all(v > 1 for v in flower.values()) else "not faster"
        at = (f"Flower takes {flower[100]:.2f}× the time of a fedlib round at N = 100" if 100 in flower
              else "Flower was not timed at N = 100")
        parts.append(f"fedlib's engine is {faster} than Flower at every N timed; {at} (smallest ratio "
                     f"over N: {min(flower.values()):.2f}×)")
    else:
        parts.append("Flower was not timed in this run, so there is no comparison with it")
    if central:
        within = "within" if max(central.values()) <= 1.2 else "not within"
        parts.append(f"fedlib's round is {within} 1.2 × a centralized epoch at every N (largest ratio "
                     f"{max(central.values()):.2f}×)")
    else:
        parts.append("the centralized epoch was not timed")
    parts.append(f"the per-client loop takes {min(loop.values()):.2f}-{max(loop.values()):.2f}× as long as fedlib's "
                 f"round" if loop else "the per-client loop was not timed")
    return f"{stored}On {run['device_name']}, " + "; ".join(parts) + "."


def _workload(row: dict) -> str:
    """A row's workload, with its convolution lowering and its compacted replays (CUDA) where recorded."""
    settings = [f"conv {row['conv']}"] if "conv" in row else []
    settings += [f"compact {row['compact']}"] if "compact" in row else []
    return row["workload"] + (f" [{', '.join(settings)}]" if settings else "")


def packed_table(record: dict) -> pd.DataFrame:
    """One row per workload (and convolution lowering) and pack size of a ``benchmarks/packed.py`` record."""
    rows = [{"workload": _workload(r), "pack size": r["pack_size"],
             "separate (runs/min)": round(r["separate_runs_per_min"], 2),
             "packed (runs/min)": round(r["packed_runs_per_min"], 2),
             "packed / separate": _ratio(r),
             "packed, % of peak": f"{100 * r['packed_fraction_of_peak']:.2f} %",
             "load before → after": f"{r['load_before_after'][0]:.1f} → {r['load_before_after'][1]:.1f}"}
            for r in record["rows"]]
    return pd.DataFrame(rows).set_index(["workload", "pack size"])


def _ratio(row: dict) -> str:
    """A row's packed/separate ratio; measured several times in turn: the median, the range and the count."""
    if row.get("repeats", 1) == 1:
        return f"{row['packed_over_separate']:.2f}x"
    low, high = row["ratio_range"]
    return f"{row['packed_over_separate']:.2f}x ({low:.2f}–{high:.2f}, {row['repeats']} repeats)"


def packed_text(record: dict, cores: int | None = None) -> str:
    """The computed sentence on one record: the packed/separate range per workload, and a warning
    when the machine was busy (load above its cores) during any measurement."""
    parts = []
    for workload in dict.fromkeys(_workload(r) for r in record["rows"]):
        rows = [r for r in record["rows"] if _workload(r) == workload]
        best = max(rows, key=lambda r: r["packed_runs_per_min"])
        parts.append(f"{workload}: packed / separate {min(r['packed_over_separate'] for r in rows):.2f}x to "
                     f"{max(r['packed_over_separate'] for r in rows):.2f}x over pack sizes "
                     f"{', '.join(str(r['pack_size']) for r in rows)}; most runs per device-minute packed: "
                     f"{best['packed_runs_per_min']:.1f} at pack size {best['pack_size']}")
    cores = cores or _cores_of(record["device"])
    busy = [r for r in record["rows"] if max(r["load_before_after"]) > cores + 0.5]
    warning = (f" (measured while other work competed: load up to "
               f"{max(max(r['load_before_after']) for r in busy):.1f} on {cores} cores; ratios are indicative)"
               if busy else "")
    repeats = record.get("repeats", 1)
    method = (f"; each ratio is the median of {repeats} measurements, separate and packed in turn"
              if repeats > 1 else "")
    return f"{record['device']}: " + "; ".join(parts) + method + warning


GPU_GOAL_MINUTES = 9  # issue 28: CELM Table 1 CIFAR-10 (75 runs, 200 rounds) inside one call of at most 9 minutes


def step_rates(record: dict) -> list[tuple[str, int, int, float]]:
    """(model, clients, batch, seconds per client-step) of each training shape a record's ``conv_choices``
    timed (``fedlib.training.conv_lowering_for``: one captured step, the faster lowering), by shape."""
    rates = []
    for key, choice in (record.get("conv_choices") or {}).items():
        model, _, clients, batch, *_ = key.split(" | ")
        rates.append((model, int(clients), int(batch), min(choice["seconds"].values()) / int(clients)))
    return sorted(rates)


def gpu_goal_text(record: dict, configs: list) -> str | None:
    """The training time of ``configs`` (CELM Table 1's CIFAR-10 runs) at the record's fastest timed step per
    client, against the goal's minutes: client-steps = training-sample passes / batch (``fedlib.app.kit.items.work``),
    a bound that leaves out evaluation, valuation and the server. None without a timed shape at their batch."""
    batch, model = configs[0].batch_size, type(build_model(configs[0].model, (3, 32, 32), 10)).__name__  # CIFAR-10
    rates = [r for r in step_rates(record) if r[2] == batch]
    if not rates:
        return None
    timed = model if any(r[0] == model for r in rates) else rates[0][0]  # the runs' own model where timed
    rates = [r for r in rates if r[0] == timed]
    fastest = min(r[3] for r in rates)
    steps = sum(work(c) for c in configs) / batch
    other = (f" (timed on the {timed}; these runs now train the larger {model}, so this is a lower bound)"
             if timed != model else "")
    return (f"{record['device']}: a captured training step of the {timed}, {batch} images per client, cost "
            f"{' / '.join(f'{1e3 * r[3]:.3f}' for r in rates)} ms per client with {' / '.join(str(r[1]) for r in rates)} "
            f"clients in the step; CELM Table 1's {len(configs)} CIFAR-10 runs are {steps / 1e6:.2f} M client-steps, "
            f"so at the fastest of these rates their training steps alone take {fastest * steps / 60:.1f} min{other}, "
            f"against the goal's {GPU_GOAL_MINUTES}-minute call")


def gpu_packs_text(configs: list, index=None) -> str | None:
    """What stored runs trained in GPU packs at the protocol of ``configs`` (CELM Table 1's CIFAR-10 runs: the
    same dataset, rounds, clients, batch and augmentation, any model or method) cost: each pack's wall time
    (its last run's) over its runs, evaluation, valuation and the server included; and ``configs`` at the
    cheapest. None without such runs."""
    def shape(r) -> tuple:
        return tuple(r.get(k) for k in ("dataset", "rounds", "n_clients", "batch_size", "augment"))

    want = shape(configs[0].resolved())
    packs: dict[tuple, list[float]] = {}  # (model, device, pack size, date) -> its stored runs' wall times
    for runs in (index or StoredIndex.read()).by_signature.values():
        for stored in runs:  # fedlib.results.StoredRun
            meta = stored.meta
            size = int((meta.get("pack") or {}).get("size", 1))
            if size > 1 and "cuda" in str(meta.get("device")) and shape(meta["resolved"]) == want:
                device = str(meta["device"]).split("(", 1)[-1].rstrip(")")
                packs.setdefault((meta["resolved"]["model"], device, size, meta.get("date")), []).append(
                    float(meta["wall_time"]))
    if not packs:
        return None
    per_run = {p: max(walls) / p[2] for p, walls in packs.items()}
    parts = []
    for model in sorted({p[0] for p in packs}):
        mine = sorted(v for p, v in per_run.items() if p[0] == model)
        sizes = sorted({p[2] for p in packs if p[0] == model})
        runs = sum(len(walls) for p, walls in packs.items() if p[0] == model)
        span = " to ".join(map(str, sizes[::max(1, len(sizes) - 1)]))  # the smallest and largest pack
        parts.append(f"the {model}: {runs} stored runs of {len(mine)} pack{'s' * (len(mine) > 1)} of {span} runs "
                     f"took {mine[0]:.1f}-{mine[-1]:.1f} device-seconds per run")
    own = [v for p, v in per_run.items() if p[0] == configs[0].model]  # the runs' own model, where timed
    note = ("" if own else
            f"; these runs now train the {configs[0].model}, which no GPU pack has timed yet, so this is a lower bound")
    return (f"{', '.join(sorted({p[1] for p in packs}))}, stored CIFAR-10 runs of this protocol trained in packs: "
            f"{'; '.join(parts)}. At the cheapest, CELM Table 1's {len(configs)} runs take "
            f"{len(configs) * min(own or per_run.values()) / 60:.1f} device-minutes, everything included{note}")


def _cores_of(device: str) -> int:
    """Cores named in a CPU device string ("cpu (x86_64, 2 cores, ...)"); GPUs: a large number (no load check)."""
    found = re.search(r"(\d+) cores", device)
    return int(found.group(1)) if found else 1_000_000


def plan_text(plan: dict[str, Any]) -> str:
    return (f"{plan['step']} steps, {plan.get('order', 'vectorized')} order, {plan['workers']} worker(s) x "
            f"{plan['intra_op_threads']} thread(s)")


def stored_benchmarks(pattern: str) -> list[tuple[Path, dict]]:
    """The stored benchmark records benchmarks/results/<pattern>, by file name."""
    return [(path, json.loads(path.read_text()))
            for path in sorted((repo_root() / "benchmarks" / "results").glob(pattern))]


def cpu_order_table(record: dict) -> pd.DataFrame:
    """One row per model, split and N: seconds per round of each plan, the ratios, the plan the rule takes."""
    rows = [{"model": r["model"], "split": r["split"], "N": r["N"], "vectorized s": r["seconds"]["vectorized"],
             "clients s": r["seconds"]["clients"], "loop s": r["seconds"]["loop"],
             "vectorized / clients": r["vectorized_over_clients"], "loop / clients": r["loop_over_clients"],
             "rule takes": r["plan"]["order"]} for r in record["rows"]]
    return pd.DataFrame(rows).set_index(["model", "split", "N"])


def cpu_order_text(record: dict) -> str:
    """The rule's plan against the faster of the two, and the engine against the loop, per stored row."""
    rows = record["rows"]
    engine = [r["seconds"][r["plan"]["order"]] for r in rows]
    best = [min(r["seconds"]["vectorized"], r["seconds"]["clients"]) for r in rows]
    over_loop = [r["seconds"]["loop"] / e for r, e in zip(rows, engine)]
    missed = [f"{r['model']} N = {r['N']} ({r['split']})" for r, e, b in zip(rows, engine, best) if e > b]
    return (f"{record['device']}: the engine's plan ran {min(over_loop):.2f}-{max(over_loop):.2f}x the loop's speed "
            f"over {len(rows)} shapes; the rule took the faster plan in {len(rows) - len(missed)} of {len(rows)}"
            + (f" (not at {', '.join(missed)})" if missed else ""))


def precision_table(record: dict) -> pd.DataFrame:
    """One row per model, workload and variant of a ``benchmarks/precision.py`` record: runs per core-hour,
    the ratio to float32 contiguous (median over the interleaved repeats, with their min-max) and the
    relative parameter difference from float32 contiguous."""
    rows = []
    for row in record["rows"]:
        for workload in ("step", "round"):
            measured = row.get(workload)
            if not measured:
                continue
            for variant, v in measured["variants"].items():
                low, high = v["ratio_min_max"]
                rows.append({"model": row["model"], "workload": f"{measured['per_core_hour_of']}: {measured['unit']}",
                             "variant": variant, "per core-hour": round(v["per_core_hour"]),
                             "× float32 contiguous": f"{v['ratio_to_float32_contiguous']:.2f} ({low:.2f}–{high:.2f})",
                             "parameter difference": f"{v['parameter_difference']:.1e}"})
    return pd.DataFrame(rows).set_index(["model", "workload", "variant"])


def precision_text(record: dict) -> str:
    """The fastest variant of each model's round, as a ratio to float32 contiguous."""
    parts = []
    for row in record["rows"]:
        variants = (row.get("round") or row.get("step") or {}).get("variants", {})
        best = max(variants.items(), key=lambda kv: kv[1]["ratio_to_float32_contiguous"], default=None)
        if best is not None:
            parts.append(f"{row['model']} {best[1]['ratio_to_float32_contiguous']:.2f}× ({best[0]})")
    return f"{record['device']}, a round's fastest variant against float32 contiguous: " + ", ".join(parts)


def ratios(run: dict, num: str, den: str = "vectorized") -> dict[int, float]:
    """{N: seconds per round of engine ``num`` / those of ``den``} where the run timed both."""
    return {r["N"]: r[f"{num}_s"] / r[f"{den}_s"] for r in run["rows"] if f"{num}_s" in r and f"{den}_s" in r}


def versions(run: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in run["versions"].items())


def engine_table(run: dict):
    """Per N: each engine's seconds per round, ratio to the vectorized engine and accuracy; Ray's start-up; the plan."""
    rows = []
    for r in run["rows"]:
        timed = {e: label for e, label in ENGINE_LABELS.items() if f"{e}_s" in r}
        row = {"N": r["N"], "samples / client": r["samples_per_client"]}
        row |= {f"{label} s/round": r[f"{e}_s"] for e, label in timed.items()}
        row |= {f"{label} / vectorized": r[f"{e}_s"] / r["vectorized_s"] for e, label in timed.items()
                if e != "vectorized" and "vectorized_s" in r}
        row |= {f"acc. {label} %": 100 * r[f"{e}_accuracy"] for e, label in ENGINE_LABELS.items()
                if f"{e}_accuracy" in r}
        row |= {"Ray start-up s": r["flower_startup_s"]} if "flower_startup_s" in r else {}
        row |= {"fedlib plan": plan_text(r["vectorized_plan"])} if "vectorized_plan" in r else {}
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("N")
    return frame.style.format({c: "{:.2f}x" if "/" in c else "{:.2f}" if "acc." in c else "{:.1f}" if "start" in c
                               else "{:.3f}" for c in frame.columns if c not in ("samples / client", "fedlib plan")},
                              na_rep="—")  # an engine not run at that N


def engine_figure(run: dict, title: str):
    """Seconds per round over N, one line per engine, the centralized epoch as a dashed level."""
    fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
    ns = [r["N"] for r in run["rows"]]
    for e, label in list(ENGINE_LABELS.items())[:-1]:  # all but the centralized epoch
        points = [(r["N"], r[f"{e}_s"]) for r in run["rows"] if f"{e}_s" in r]
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
    if any("central_s" in r for r in run["rows"]):
        ax.axhline(run["rows"][0]["central_s"], color="gray", ls="--", label="centralized epoch")
    ax.set(xscale="log", yscale="log", xlabel="clients N", ylabel="seconds per round", title=title, xticks=ns,
           xticklabels=[str(n) for n in ns])
    ax.legend(fontsize=8)
    return fig


class Performance(Chapter):
    """The live benchmark run, stored runs on other devices, where a round's time goes, the cost of valuation."""

    name = "performance"
    live: dict[str, Any] = {}  # this build's benchmark JSON (``measure``)
    stored_note = ""  # the evidence build: where its (stored) "live" run comes from

    def measure(self) -> str:
        """Runs ``benchmarks/peers.py`` once per engine with the profile's parameters (each kept in the cache: a
        warm rebuild does not re-time), the 1-minute load average read before and after each; returns the printed
        tables. The evidence build times nothing: it shows the stored CPU run (benchmarks/results/)."""
        if self.evidence:
            path = repo_root() / "benchmarks" / "results" / STORED_CPU_RUN
            self.live = json.loads(path.read_text())
            unknown = "" if self.live.get("load") else "; the load average during it was not recorded"
            self.stored_note = f"Stored measurement (benchmarks/results/{STORED_CPU_RUN}, {self.live['date']}{unknown}): "
            return (f"Evidence build: nothing is timed. The tables below are the stored CPU measurement "
                    f"benchmarks/results/{STORED_CPU_RUN} of {self.live['date']} ({self.live['device_name']}); "
                    "`make book PROFILE=quick` times the engines on this machine.")
        p = self.params
        engines = [e for e in p["engines"] if e != "flower" or p["flower_max_clients"] > 0]
        common = ["--clients", *map(str, p["clients"]), "--rounds", str(p["rounds"]), "--fraction", str(p["fraction"]),
                  "--skip-flower-above", str(p["flower_max_clients"])]
        extra = ["--valuation-clients", str(p["valuation_clients"]), "--valuation-rounds", str(p["valuation_rounds"]),
                 "--valuation-fraction", str(p["valuation_fraction"])] + (["--breakdown"] if p["breakdown"] else [])
        runs, logs = [], []
        for i, engine in enumerate(engines):  # one invocation each: the load is read around every engine
            report("stage", name=f"timing {ENGINE_LABELS[engine]}", done=i, total=len(engines))
            result, log = measured_benchmark("peers.py", [*common, "--engines", engine, *(extra if i == 0 else [])])
            runs.append({**result, "engine": engine})
            logs.append(log)
        report("stage", name="engines timed", done=len(engines), total=len(engines))
        self.live, self.stored_note = merge_runs(runs), ""
        return "\n\n".join(logs)
    def live_run(self) -> Table:
        """The live run's table, its figure and its versions line (note, under the figure)."""
        live = self.live
        figure = engine_figure(live, f"{live['device_name']}, torch {live['versions']['torch']}")
        return Table(engine_table(live), note=f"versions: {versions(live)} | data: {live['dataset']}", figure=figure)

    def live_verdict(self) -> dict[str, Any]:
        """The verdict on the live run (``live_text``), and the load under which each engine was timed."""
        return {"live_text": Markdown(live_text(self.live, self.stored_note))}

    def show_stored_runs(self) -> dict[str, Any]:
        """Shows each stored device run (heading, table, figure); glues each device's Flower / fedlib ratios."""
        lines = []
        for path, run in stored_benchmarks("peers_*.json"):
            display(Markdown(f"### {run['device_name']} ({path.name}, {run['date']})\n\n"
                             f"Versions: {versions(run)}; data: {run['dataset'].split(' from ')[0]}; "
                             f"median of {run['rounds']} rounds after a warm-up."), engine_table(run))
            engine_figure(run, run["device_name"])
            plt.show()
            flower = ratios(run, "flower")
            met = [str(n) for n, v in flower.items() if n >= 20 and v >= 10]
            missed = [str(n) for n, v in flower.items() if n >= 20 and v < 10]
            lines.append(f"{run['device_name']}: Flower / fedlib = "
                         + ", ".join(f"{v:.1f}x at N = {n}" for n, v in flower.items())
                         + (f"; the 10x goal for N ≥ 20 is met at N = {', '.join(met)}" if met else "")
                         + (f" and missed at N = {', '.join(missed)}" if missed else ""))
        return {"gpu_summary": Markdown("; ".join(lines) if lines else "no stored device runs")}

    def packed_runs(self) -> dict[str, Any]:
        """Shows each stored ``benchmarks/packed.py`` measurement (table of runs per device-minute, packed vs
        separate); glues one computed sentence per device."""
        table1 = celm_protocol.experiment_configs(load_profile("celm", "paper"), "table1_cifar10")
        lines, goals = [], [text] if (text := gpu_packs_text(table1)) else []
        for path, record in stored_benchmarks("packed_*.json"):
            goals += [text] if (text := gpu_goal_text(record, table1)) else []
            table = packed_table(record)
            reduced = record.get("reduced") or {}
            protocol = ("the paper profile's runs" if not any(reduced.values()) else
                        f"REDUCED runs ({reduced.get('rounds') or 'all'} rounds, {reduced.get('fraction') or 1} of the "
                        f"training data, {reduced.get('test_samples') or 'all'} test samples)")
            display(Markdown(f"### {record['device']} ({path.name}, {record['date']})\n\nCELM Table 1 runs, "
                             f"{protocol}; peak: a 4096² float32 matmul, {record['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s."),
                    table)
            lines.append(packed_text(record))
        return {"packed_summary": Markdown("; ".join(lines) if lines else "no stored packed benchmark yet "
                                           "(`python benchmarks/packed.py --json benchmarks/results/packed_<device>.json`)"),
                "gpu_goal_summary": Markdown("; ".join(goals) if goals else "no stored GPU step timings yet")}

    def cpu_order_runs(self) -> dict[str, Any]:
        """Shows each stored ``benchmarks/cpu_order.py`` measurement (seconds per round of the vectorized plan,
        the client order and the loop); glues one computed sentence per device."""
        lines = []
        for path, record in stored_benchmarks("cpu_order_*.json"):
            display(Markdown(f"### {record['device']} ({path.name}, {record['date']})\n\nMedian of {record['repeats']} "
                             f"rounds per plan, interleaved; load average {record['load_before_after'][0]} before, "
                             f"{record['load_before_after'][1]} after."), cpu_order_table(record))
            lines.append(cpu_order_text(record))
        return {"cpu_order_summary": Markdown("; ".join(lines) if lines else "no stored CPU order benchmark yet "
                                              "(`python benchmarks/cpu_order.py --json benchmarks/results/"
                                              "cpu_order_<device>.json`)")}

    def precision_runs(self) -> dict[str, Any]:
        """Shows each stored ``benchmarks/precision.py`` record (runs per core-hour of each model in each precision
        and memory format, as ratios to float32 contiguous); glues one computed sentence per device."""
        lines = []
        for path, record in stored_benchmarks("precision_*.json"):
            load = record["load_before_after"]
            display(Markdown(f"### {record['device']} ({path.name}, {record['date']})\n\n{record['repeats']} repeats, "
                             f"the variants interleaved; load average {load[0]} before, {load[1]} after"
                             + (" (other work shared the cores: the ratios are indicative)." if competed(
                                 {"before": load[0], "after": load[1], "cores": _cores_of(record["device"])})
                                else ".")), precision_table(record))
            lines.append(precision_text(record))
        return {"precision_summary": Markdown("; ".join(lines) if lines else "no stored precision benchmark yet "
                                              "(`python benchmarks/precision.py --json benchmarks/results/"
                                              "precision_<device>.json`)")}

    def breakdown(self) -> Table:
        """Where a round's time goes per N: table, the shares the text quotes, figure (no table nor figure when not
        measured)."""
        if not self.live.get("breakdown"):
            return Table(None, dict.fromkeys(("train_share", "overhead_share"), Markdown(NOT_MEASURED)))
        parts = pd.DataFrame(self.live["breakdown"]).set_index("N")
        parts["plan"] = parts["plan"].map(plan_text)
        shown = parts[[*ROUND_PARTS, "round_s", "warmup_s", "plan"]].rename(columns={
            **{k: f"{v} s" for k, v in ROUND_PARTS.items()}, "round_s": "round s", "warmup_s": "one-time warm-up s"})
        shares = parts[list(ROUND_PARTS)].div(parts["round_s"], axis=0)
        fig, ax = plt.subplots(figsize=(6, 3.2), layout="constrained")
        left = np.zeros(len(parts))
        for key, label in ROUND_PARTS.items():
            ax.barh([str(n) for n in parts.index], shares[key].to_numpy(), left=left, label=label)
            left += shares[key].to_numpy()
        ax.set(xlabel="share of a round", ylabel="clients N", xlim=(0, 1.05),
               title=f"{self.live['device_name']}, FedAvg round")
        ax.legend(fontsize=8, loc="lower right")
        train, overhead = shares["train_s"].items(), shares["overhead_s"].items()
        values = {"train_share": Markdown(", ".join(f"{100 * v:.0f} % at N = {n}" for n, v in train)),
                  "overhead_share": Markdown(", ".join(f"{100 * v:.1f} % at N = {n}" for n, v in overhead))}
        return Table(shown.style.format({c: "{:.4f}" for c in shown.columns if c != "plan"}), values, figure=fig)

    def valuation(self) -> Table:
        """Server seconds per round of each valuation method against a FedAvg round and its arithmetic: table,
        the most and least expensive, figure (no table nor figure when not measured)."""
        if not self.live.get("valuation"):
            return Table(None, dict.fromkeys(("val_most", "val_least"), Markdown(NOT_MEASURED)))
        val = pd.DataFrame(self.live["valuation"]).set_index("method")
        shown = val[[k for k in VALUATION_COLUMNS if k in val]].rename(
            columns={k: column for k, (column, _) in VALUATION_COLUMNS.items()})
        if "flops" in val:
            shown["GFLOP / round"] = shown["GFLOP / round"] / 1e9
        fig, ax = plt.subplots(figsize=(6, 0.4 * len(val) + 1), layout="constrained")
        ax.barh(val.index[::-1], val["ratio"][::-1], color="tab:purple")
        ax.axvline(1.0, color="gray", ls="--")
        ax.set(xscale="log", xlabel="server time / FedAvg round",
               title=f"{self.live['valuation_clients']} clients, {self.live['device_name']}")
        costly = val.drop(index="FedAvg (one whole round)")["ratio"]
        values = {"val_most": Markdown(f"{costly.idxmax()} ({costly.max():.2f}x a FedAvg round)"),
                  "val_least": Markdown(f"{costly.idxmin()} ({costly.min():.3f}x)")}
        return Table(shown.style.format(dict(VALUATION_COLUMNS.values()), na_rep="-"), values, figure=fig)
