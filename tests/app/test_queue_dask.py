"""The results queue on a Dask cluster (issue 47): a scheduler and two workers on 127.0.0.1, one declaring a
(fake) GPU; the stored runs equal a local queue's bit for bit, a worker killed mid-unit loses only that unit
(rescheduled, nothing partial stored), the GPU-only unit runs on the GPU worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from fedlib.app import cluster, queue  # noqa: E402
from fedlib.data import data_missing  # noqa: E402
from fedlib.cache import key_of  # noqa: E402
from fedlib.store import Store  # noqa: E402

# what two executions of one run may differ in (and time_*): timings, dates, and the commit (the repository's
# HEAD, which another checkout's commits move between the two queues)
TIMINGS = {"wall_time", "cpu_time", "date", "warmup_s", "commit"}


def without_timings(value):
    """A stored entry without its timings and dates (fedlib.determinism: the rest is bitwise on one machine)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS and not k.startswith("time_")}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def stored(root: Path) -> dict[str, dict]:
    """Config key -> stored entry of every valid file under ``root``/runs; an invalid one fails the test."""
    store = Store(root).cache()
    out = {}
    for path in sorted(Store(root).runs.iterdir()):
        payload, problem = store.read(key_of(path))
        assert problem is None and payload is not None, f"{path.name}: {problem}"
        out[key_of(path)] = payload
    return out


def units_of_fedms_smoke(with_gpu: bool):
    """Units of the fedms smoke profile: a pack of 2 MNIST runs and the CIFAR-10 run, GPU-only (without
    ``with_gpu``, an MNIST run alone); the queue's own planning (plan, plan_packs)."""
    items = [i for i in queue.unique(queue.chapter_items("fedms", "smoke")) if i.table == "Table 1"]
    mnist = [i for i in items if i.dataset == "mnist"][:3]
    other = [i for i in items if i.dataset == "cifar10"][:1] if with_gpu else mnist[2:]
    model = queue.CostModel()
    entries = queue.plan(items=mnist[:2], cost_model=model)
    units = queue.plan_packs(entries, "cpu", max_rows=1000, cost_model=model)
    assert len(units) == 1 and isinstance(units[0], queue.Pack)
    return units + queue.plan(items=other, cost_model=model)


def start_worker(address: str, name: str, env: dict, *resources: str) -> subprocess.Popen:
    """``dask worker`` (a nanny and its worker process), one thread, on 127.0.0.1; as book/cluster.md starts one."""
    return subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--name", name,
                             "--nthreads", "1", "--nworkers", "1", "--host", "127.0.0.1", "--no-dashboard",
                             "--death-timeout", "30", *resources],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


class Killer(threading.Thread):
    """Kills (SIGKILL) the first worker process on which a unit has been running for ``after`` s."""

    def __init__(self, client, after: float = 1.0, deadline: float = 150.0):
        super().__init__(daemon=True)
        self.client, self.after, self.deadline = client, after, time.monotonic() + deadline
        self.killed: tuple[str, str] | None = None  # (the worker's name, the task key it ran)
        self.stop = threading.Event()

    def run(self):
        seen: dict[str, float] = {}
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            try:
                names = {a: w.get("name") for a, w in self.client.scheduler_info(n_workers=-1)["workers"].items()}
                busy = self.client.processing()
            except Exception:  # noqa: BLE001 - the client is closing
                return
            for address, keys in busy.items():
                for key in keys:
                    since = seen.setdefault(key, time.monotonic())
                    if str(key).startswith("fedlib-unit-") and time.monotonic() - since > self.after:
                        pid = self.client.run(os.getpid, workers=[address])[address]
                        os.kill(pid, signal.SIGKILL)
                        self.killed = (names.get(address), str(key))
                        return
            time.sleep(0.1)


@pytest.fixture()
def stores(tmp_path, monkeypatch):
    """Two stores (local, cluster) and two fedlib caches, so that neither queue reads the other's runs."""
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path / "repo")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    if data_missing("mnist"):
        pytest.skip(data_missing("mnist"))
    return tmp_path


def test_a_dask_queue_stores_what_a_local_queue_stores_and_survives_a_killed_worker(stores, monkeypatch, capsys):
    from distributed import Client, LocalCluster

    from fedlib.__main__ import main

    gpu_missing = data_missing("cifar10")  # the GPU-only unit is CIFAR-10's; without its data, skipped
    # the local queue: two processes, each storing its runs
    monkeypatch.setenv("FEDLIB_RESULTS", str(stores / "local"))
    monkeypatch.setenv("FEDLIB_CACHE", str(stores / "cache-local"))
    units = units_of_fedms_smoke(with_gpu=gpu_missing is None)
    local = queue.run_queue(units, "smoke", workers=2, log=lambda _: None, poll=0.1)
    assert not local.failed and len(local.stored) == sum(len(u.items) for u in units)

    # the cluster: a scheduler here, a CPU worker and a worker declaring a GPU, both on 127.0.0.1
    monkeypatch.setenv("FEDLIB_RESULTS", str(stores / "dask"))
    monkeypatch.setenv("FEDLIB_CACHE", str(stores / "cache-dask"))  # the workers' (they inherit this environment)
    units = units_of_fedms_smoke(with_gpu=gpu_missing is None)
    workers = []
    lines: list[str] = []
    with LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None, processes=True) as local_cluster, \
            Client(local_cluster.scheduler_address, timeout=30) as client:
        try:
            workers = [start_worker(local_cluster.scheduler_address, "cpu", dict(os.environ)),
                       start_worker(local_cluster.scheduler_address, "gpu", dict(os.environ), "--resources", "GPU=1")]
            client.wait_for_workers(2, timeout=120)
            assert cluster.describe_cluster(client) == "2 worker(s), 2 thread(s), 1 declaring GPU"
            killer = Killer(client)
            killer.start()
            remote = cluster.run_queue(units, client, "smoke", log=lines.append, poll=0.1)
            killer.stop.set()
            killer.join(10)
            if gpu_missing is None:  # the command line on the cluster: its CIFAR-10 run is stored now, none pending
                assert main(["results", "--only", "fedms", "--profile", "smoke", "--dataset", "cifar10", "--seed", "0",
                             "--scheduler", local_cluster.scheduler_address, "--scheduler-wait", "60"]) == 0
                out = capsys.readouterr().out
                assert (f"results queue (smoke profile, the cluster at {local_cluster.scheduler_address}: "
                        in out and "1 declaring GPU): 0 pending, 1 stored, 0 not runnable here" in out)
                assert out.rstrip().endswith("0 run(s) stored in 0 s; 0 failed; 0 stopped at the budget")
        finally:
            for proc in workers:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    assert not remote.failed and not remote.absent, (remote.failed, remote.absent, lines)
    assert len(remote.stored) == sum(len(u.items) for u in units)
    assert killer.killed is not None, "no unit was seen running on a worker"
    # the killed worker's unit was rescheduled by Dask: the queue started each unit once, and stored it whole
    assert sum(line.startswith("[start") for line in lines) == len(units)
    # exactly the finished records, each valid; no claim left, nothing set aside
    ours, theirs = stored(stores / "dask"), stored(stores / "local")
    assert sorted(ours) == sorted(theirs) == sorted(i.key for u in units for i in u.items)
    assert sorted(p.name for p in Store(stores / "dask").runs.iterdir()) == sorted(f"{k}.json.zd" for k in ours)
    assert all(queue.stored_state(i) == (True, None) for u in units for i in u.items)
    # bit for bit the local queue's runs, timings and dates aside
    for key in ours:
        assert without_timings(ours[key]) == without_timings(theirs[key]), key
    # which worker ran each unit is in the outcome and the log, not in the stored files
    assert set(remote.ran_on) == set(ours)
    assert not any("gpu at" in str(entry) or "cpu at" in str(entry) for entry in ours.values())
    if gpu_missing is None:
        cifar = next(i for u in units for i in u.items if i.gpu)
        assert remote.ran_on[cifar.key].startswith("gpu at tcp://127.0.0.1:") and remote.ran_on[cifar.key].endswith(
            "(cpu)")  # the fake GPU worker has no CUDA: it resolved its CPU
        assert any(line.startswith("[done") and "CIFAR-10" in line and "on gpu at" in line for line in lines)
    else:
        pytest.skip(f"the GPU-only unit: {gpu_missing}")


class FakeClient:
    """What DaskBackend asks a client before submitting: the workers (none declaring a GPU)."""

    def scheduler_info(self, n_workers=-1):
        return {"workers": {"tcp://127.0.0.1:1": {"nthreads": 1, "resources": {}}}}

    def submit(self, *args, **kwargs):
        raise AssertionError("nothing may be submitted")


def test_a_gpu_unit_without_a_gpu_worker_and_a_worker_without_the_data_are_logged_not_run(stores, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS", str(stores / "dask"))
    item = next(i for i in queue.chapter_items("fedms", "smoke") if i.dataset == "cifar10")
    entry = queue.Entry(item, 1.0, "test", False, None)
    lines: list[str] = []
    out = cluster.run_queue([entry], FakeClient(), "smoke", log=lines.append, poll=0.01)
    assert out.absent == [(item, "no worker of the cluster declares a GPU resource (dask worker ... --resources "
                                 "GPU=1)")]
    assert not out.stored and not out.failed and not list(Store(stores / "dask").runs.glob(".*.claim"))
    assert any(line.startswith("[absent] fedms Table 1 | CIFAR-10") for line in lines)
    # a worker whose data root lacks the dataset answers with a marker, not an exception
    monkeypatch.setenv("FEDLIB_DATA", str(stores / "no-data"))
    answer = cluster.run_unit(cluster.unit_spec(entry), packed=False)
    assert set(answer) == {"absent", "where"} and answer["absent"].startswith("cifar10 data absent (looked in ")


def test_the_cli_names_an_unreachable_scheduler_in_one_line(stores, monkeypatch, capsys):
    from fedlib.__main__ import main

    monkeypatch.setenv("FEDLIB_RESULTS", str(stores / "dask"))
    code = main(["results", "--only", "fedms", "--profile", "smoke", "--dataset", "mnist", "--seed", "0",
                 "--scheduler", "tcp://127.0.0.1:9", "--scheduler-wait", "2"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("fedlib results: --scheduler: cannot reach the scheduler at tcp://127.0.0.1:9 (")
    assert err.count("\n") == 1


def test_a_slurm_job_script_starts_a_worker_with_its_resources():
    jobqueue = pytest.importorskip("dask_jobqueue")
    with jobqueue.SLURMCluster(cores=1, processes=1, memory="8GB", walltime="02:00:00",
                               worker_extra_args=["--resources", "GPU=1"], job_extra_directives=["--gres=gpu:1"],
                               job_script_prologue=["export FEDLIB_DATA=$HOME/datasets OMP_NUM_THREADS=1"],
                               scheduler_options={"host": "127.0.0.1", "dashboard_address": None}) as slurm:
        script = slurm.job_script()
    lines = script.splitlines()
    assert "#SBATCH --gres=gpu:1" in lines and "export FEDLIB_DATA=$HOME/datasets OMP_NUM_THREADS=1" in lines
    worker = next(line for line in lines if "distributed.cli.dask_worker" in line)
    assert worker.split()[3] == slurm.scheduler_address and worker.endswith("--resources GPU=1")
    assert "--nthreads 1" in worker
