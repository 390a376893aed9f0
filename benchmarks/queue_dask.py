"""The results queue on local processes vs on a Dask cluster (issue 47), one smoke queue each, in one invocation.

The queue of one chapter's smoke profile (default: fedms, 13 runs: 2 packs of 6 MNIST runs and the
CIFAR-10 run, GPU-only) is run twice from empty stores (and empty fedlib caches, so nothing is served
from a cache):

  - local: ``fedlib.app.queue.run_queue`` with 2 worker processes (each run process imports, loads and stores);
  - dask:  ``fedlib.app.cluster.run_queue`` on a ``distributed.LocalCluster`` of 2 worker processes on
           127.0.0.1, one thread each, both declaring a (fake) ``GPU=1`` resource so that the GPU-only unit
           runs (on their CPU); the workers send the runs back and this process stores them.

Recorded: the wall time of each queue (planning excluded; for dask, the cluster's start excluded and
given apart), the runs stored, and whether the stored records are equal bit for bit (timings, dates and
the commit aside: ``fedlib.determinism``). The load average is recorded: a 2-core machine shared with
other work gives indicative times.

    python benchmarks/queue_dask.py [--chapter fedms] [--json benchmarks/results/queue_dask_cpu-2core.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedlib.app import cluster, queue  # noqa: E402
from fedlib.cache import FORMS  # noqa: E402
from fedlib.cache import key_of  # noqa: E402
from fedlib.provenance import environment  # noqa: E402
import fedlib.store  # noqa: E402
from fedlib.store import Store  # noqa: E402

SKIPPED = {"wall_time", "date", "warmup_s", "commit"}  # and every time_*


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in SKIPPED and not k.startswith("time_")}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def stored(root: Path) -> dict[str, dict]:
    store = Store(root)
    return {key_of(p): store.read(key_of(p))[0] for p in sorted(p for p in store.runs.iterdir() if p.name.endswith(FORMS))}


def units(chapter: str):
    model = queue.CostModel()
    entries = queue.plan("smoke", only=[chapter], cost_model=model)
    return queue.plan_packs(entries, "cpu", max_rows=64, cost_model=model)  # the CLI's --pack on, on a CPU


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chapter", default="fedms")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    tmp = Path(tempfile.mkdtemp(prefix="queue_dask-"))
    fedlib.store.default_root = lambda: tmp / "repo"  # nothing read from the repository's store
    record = {"benchmark": "queue_dask", "chapter": args.chapter, "profile": "smoke", "workers": 2,
              "load_before": os.getloadavg()[0]}

    os.environ.update(FEDLIB_RESULTS=str(tmp / "local"), FEDLIB_CACHE=str(tmp / "cache-local"))
    planned = units(args.chapter)
    record["units"] = len(planned)
    record["runs"] = sum(len(u.items) for u in planned)
    t0 = time.perf_counter()
    local = queue.run_queue(planned, "smoke", workers=2, log=lambda line: print("local:", line, flush=True))
    record["local"] = {"wall_s": round(time.perf_counter() - t0, 1), "stored": len(local.stored),
                       "failed": len(local.failed)}

    from distributed import Client, LocalCluster

    os.environ.update(FEDLIB_RESULTS=str(tmp / "dask"), FEDLIB_CACHE=str(tmp / "cache-dask"))
    planned = units(args.chapter)
    t0 = time.perf_counter()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
                      resources={cluster.GPU: 1}) as local_cluster, Client(local_cluster) as client:
        client.wait_for_workers(2, timeout=120)
        started = time.perf_counter()
        remote = cluster.run_queue(planned, client, "smoke", log=lambda line: print("dask:", line, flush=True))
        ended = time.perf_counter()
    record["dask"] = {"wall_s": round(ended - started, 1), "cluster_start_s": round(started - t0, 1),
                      "stored": len(remote.stored), "failed": len(remote.failed), "absent": len(remote.absent),
                      "ran_on": sorted(set(remote.ran_on.values()))}
    ours, theirs = stored(tmp / "dask"), stored(tmp / "local")
    record["same_runs"] = sorted(ours) == sorted(theirs)
    record["records_equal"] = record["same_runs"] and all(
        without_timings(ours[k]) == without_timings(theirs[k]) for k in ours)
    record["load_after"] = os.getloadavg()[0]
    record.update(environment("cpu"))
    print(json.dumps(record, indent=1))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if record["records_equal"] and not local.failed and not remote.failed else 1


if __name__ == "__main__":
    sys.exit(main())
