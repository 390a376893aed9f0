"""Sweeps on Dask distributed: results come back into the local cache, and a sweep killed
part-way resumes without redoing the runs that finished."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from distributed import Client, LocalCluster

import fedlib
from fedlib.cache import ResultCache
from fedlib.config import make_config

SYNTH = dict(dataset="synthetic", model="mlp", n_clients=6, rounds=4, batch_size=16, local_epochs=3, lr=0.1)
N_RUNS = 8

SWEEP = textwrap.dedent(f"""
    import sys
    from distributed import Client, LocalCluster
    import fedlib
    from fedlib.cache import ResultCache
    from fedlib.config import make_config
    cfgs = [make_config({SYNTH!r}, seed=s) for s in range({N_RUNS})]
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            fedlib.run_many(cfgs, executor=client, cache=ResultCache(sys.argv[1]), progress=False)
""")


class CountingExecutor:
    """Wraps an executor and records which configs were submitted."""

    def __init__(self, inner):
        self.inner, self.submitted = inner, []

    def submit(self, fn, config):
        self.submitted.append(config["seed"])
        return self.inner.submit(fn, config)


def _cached(store, cfgs):
    return [c.seed for c in cfgs if store.get(c.key()) is not None]


def test_a_killed_dask_sweep_resumes_without_redoing_finished_runs(tmp_path):
    store = ResultCache(tmp_path / "cache")
    cfgs = [make_config(SYNTH, seed=s) for s in range(N_RUNS)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SWEEP, str(tmp_path / "cache")], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    try:
        while len(_cached(store, cfgs)) < 2:  # kill the whole sweep (client, scheduler, worker) part-way
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the Dask sweep cached nothing within 180 s"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finished = _cached(store, cfgs)
    assert 2 <= len(finished) < N_RUNS
    stamps = {s: store.path(cfgs[s].key()).stat().st_mtime_ns for s in finished}

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        counting = CountingExecutor(client)
        results = fedlib.run_many(cfgs, executor=counting, cache=store, progress=False)

    assert sorted(counting.submitted) == sorted(set(range(N_RUNS)) - set(finished))  # only the missing runs
    assert {s: store.path(cfgs[s].key()).stat().st_mtime_ns for s in finished} == stamps  # not rewritten
    assert _cached(store, cfgs) == list(range(N_RUNS))
    assert [r.config["seed"] for r in results] == list(range(N_RUNS))
    direct = fedlib.run(cfgs[-1], cache=False, progress=False)
    assert results[-1].final["accuracy"] == direct.final["accuracy"]  # a Dask run equals a local one
