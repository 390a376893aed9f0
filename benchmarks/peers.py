"""The same FedAvg federation on four engines, in one invocation.

Fashion-MNIST, CELM's MLP (784-256-128-64-10), 1 local epoch, batch 128, SGD lr 0.1, every
client selected, IID split of the 60,000 training samples over N clients:

  (a) fedlib's engine (vmap over the stacked population; the steps after a round's first one
      replayed from a CUDA graph on CUDA; on CPU one worker thread per core with one intra-op thread,
      each training its clients as one vmapped call or one client at a time, by the rule of
      ``fedlib.plans.client_order``: the plan is printed per N),
  (b) fedlib's per-client loop (the test oracle),
  (c) Flower's simulation engine (flwr + Ray; a standard NumPyClient wrapping the same
      PyTorch model and data; Ray's start-up reported separately),
  (d) one centralized epoch over the same samples.

Each engine runs ``--rounds`` timed rounds after one warm-up round, all from the same initial
model; the table gives the median seconds per round, the ratios to (a), and the test accuracy
after all rounds (similar accuracy shows the same work was done). ``--json`` writes the table.
The optional engine ``eager`` is (a) as it was before capture, worker threads and the client order
(every step eager, one vectorized call using all intra-op threads), to show what they gain. ``--breakdown``
adds where a fedlib round's time goes (``benchmarks/breakdown.py``).

    python benchmarks/peers.py [--clients 5 20 100 500] [--rounds 3] [--device cpu]
                               [--engines vectorized eager loop flower central] [--json out.json]
                               [--compile off|auto|on] [--workers K] [--breakdown]

Flower is an optional dependency of the benchmark only: ``pip install "flwr[simulation]==1.42.0"``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from breakdown import round_breakdown, valuation_arithmetic  # noqa: E402
from round_speed import _sync, centralized_epoch, fedavg_round  # noqa: E402

from fedlib.data import load_dataset  # noqa: E402
from fedlib.models import build_model  # noqa: E402
from fedlib.partition import iid  # noqa: E402
from fedlib.plans import execution_plan  # noqa: E402
from fedlib.population import LocalTraining, ParamLayout, evaluate  # noqa: E402
from fedlib.training import train_clients  # noqa: E402
from fedlib.testing import train_clients_loop

ENGINES = ("vectorized", "eager", "loop", "flower", "central")
DEFAULT_ENGINES = ("vectorized", "loop", "flower", "central")
BATCH, LR = 128, 0.1


def device_name(device: torch.device) -> str:
    from fedlib.provenance import device_name as name

    return name(device)


def accuracy(model, flat, x_test, y_test, n_classes) -> float:
    return float(evaluate(model, flat[None], {}, x_test, y_test, n_classes).accuracy[0])


def run_fedlib(engine, model, flat0, x, y, indices, rounds, device, compile_mode=None, workers=None, order=None):
    """rounds + 1 FedAvg rounds (the first is the warm-up); returns (round seconds, final flat)."""
    cfg = LocalTraining(epochs=1, batch_size=BATCH, lr=LR, compile=compile_mode, workers=workers, order=order)
    flat, times = flat0.clone(), []
    for r in range(rounds + 1):
        _sync(device)
        t0 = time.perf_counter()
        flat = fedavg_round(engine, model, flat, x, y, indices, cfg, r, device)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times[1:], flat


def run_central(model, flat0, x, y, rounds, device):
    layout = ParamLayout(model)
    layout.load_into(model, flat0.clone())
    times = []
    for r in range(rounds + 1):
        _sync(device)
        t0 = time.perf_counter()
        centralized_epoch(model, x, y, BATCH, LR, r)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times[1:], layout.flat_of(model).detach().clone()


# -- Flower --------------------------------------------------------------------------------------
def _actor_state(dataset: str, data_root, n: int, device: str, fraction: float = 1.0):
    """Data, model and partition, built once per Ray actor process and kept in sys.modules."""
    import types

    cache = sys.modules.setdefault("_fedlib_peers_actor", types.ModuleType("_fedlib_peers_actor"))
    key = (dataset, str(data_root), n, device, fraction)
    if getattr(cache, "key", None) != key:
        ds = load_dataset(dataset, root=data_root, device=device, download=False)
        if fraction < 1:
            keep = torch.randperm(len(ds.y_train), generator=torch.Generator().manual_seed(0))
            keep = keep[: int(fraction * len(keep))].to(device)
            ds.x_train, ds.y_train = ds.x_train[keep], ds.y_train[keep]
        torch.manual_seed(0)
        cache.model = build_model("mlp", ds.input_shape, ds.num_classes).to(device)
        cache.x, cache.y = ds.x_train, ds.y_train
        cache.indices = [torch.as_tensor(ix, device=device) for ix in iid(ds.y_train.cpu().numpy(), n, seed=0).indices]
        cache.key = key
    return cache


def run_flower(dataset, data_root, flat0, n, rounds, device, cpus_per_client, gpus_per_client, fraction=1.0):
    """rounds + 1 Flower rounds; returns (round seconds, final flat, Ray start-up seconds)."""
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    device_str = str(device)

    class MLPClient(NumPyClient):
        def __init__(self, partition: int):
            torch.set_num_threads(max(1, int(cpus_per_client)))  # one thread per Ray CPU, whatever the env says
            self.state = _actor_state(dataset, data_root, n, device_str, fraction)
            self.partition = partition

        def fit(self, parameters, config):
            started = time.monotonic()  # CLOCK_MONOTONIC: comparable across the actor processes
            s = self.state
            with torch.no_grad():
                for p, a in zip(s.model.parameters(), parameters):
                    p.copy_(torch.as_tensor(a, device=p.device))
            opt = torch.optim.SGD(s.model.parameters(), lr=LR)
            ix = s.indices[self.partition]
            order = ix[torch.randperm(len(ix), generator=torch.Generator().manual_seed(int(config["round"])))
                       .to(ix.device)]
            for lo in range(0, len(order), BATCH):
                b = order[lo:lo + BATCH]
                opt.zero_grad()
                F.cross_entropy(s.model(s.x[b]), s.y[b]).backward()
                opt.step()
            return [p.detach().cpu().numpy() for p in s.model.parameters()], len(ix), {"started": started}

    def client_fn(context: Context):
        return MLPClient(int(context.node_config["partition-id"])).to_client()

    marks: dict[int, list[float]] = {}
    final: list = []
    first_fit: list[float] = []
    model = build_model("mlp", (1, 28, 28), 10)
    initial = [a.detach().cpu().numpy() for a in ParamLayout(model).unflatten(flat0.cpu()).values()]

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            marks[server_round] = [time.monotonic()]
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            if failures:
                raise RuntimeError(f"Flower round {server_round}: {len(failures)} client(s) failed: {failures[0]!r}")
            out = super().aggregate_fit(server_round, results, failures)
            marks[server_round].append(time.monotonic())
            first_fit.append(min(fit.metrics["started"] for _, fit in results))
            final[:] = [out[0]]
            return out

    def server_fn(context: Context):
        strategy = TimedFedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n, min_evaluate_clients=0,
                               min_available_clients=n, initial_parameters=ndarrays_to_parameters(initial),
                               on_fit_config_fn=lambda r: {"round": r})
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds + 1))

    resources = {"num_cpus": cpus_per_client, "num_gpus": gpus_per_client}
    backend = {"client_resources": resources, "init_args": {"log_to_driver": False, "include_dashboard": False}}
    t0 = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
                       num_supernodes=n, backend_config=backend)
    if len(marks) != rounds + 1 or not final:
        raise RuntimeError(f"Flower finished {len(marks)} of {rounds + 1} rounds; see its log above")
    times = [marks[r][1] - marks[r][0] for r in sorted(marks)]
    startup = first_fit[0] - t0  # Ray and the first actors start before the first client trains
    arrays = parameters_to_ndarrays(final[0])
    flat = torch.cat([torch.as_tensor(a).reshape(-1) for a in arrays]).to(flat0.device)
    return times[1:], flat, startup


# -- valuation overhead: benchmarks/breakdown.py -----------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 20, 100, 500])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per engine, after one warm-up round")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dataset", default="fmnist", help="fmnist (default) or mnist: the same shapes and sizes")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--fraction", type=float, default=1.0, help="use this share of the training set (smoke runs)")
    ap.add_argument("--engines", nargs="+", default=list(DEFAULT_ENGINES), choices=ENGINES)
    ap.add_argument("--compile", choices=("off", "auto", "on"), default=None,
                    help="fedlib's captured step (default: FEDLIB_COMPILE, else auto: CUDA graphs on CUDA)")
    ap.add_argument("--workers", type=int, default=None,
                    help="fedlib's CPU client groups (default: FEDLIB_CPU_WORKERS, else one per intra-op thread)")
    ap.add_argument("--breakdown", action="store_true", help="also time the parts of a fedlib.run round at each N")
    ap.add_argument("--skip-loop-above", type=int, default=10**9)
    ap.add_argument("--skip-flower-above", type=int, default=10**9)
    ap.add_argument("--flower-cpus", type=float, default=1.0, help="Ray CPUs per Flower client (actors = cores / this)")
    ap.add_argument("--flower-gpus", type=float, default=None,
                    help="Ray GPUs per Flower client on CUDA (default 1/min(N, cores))")
    ap.add_argument("--json", help="write the table and provenance here")
    ap.add_argument("--valuation-clients", type=int, default=0,
                    help="also time each valuation method's server work with this many clients (0: skip)")
    ap.add_argument("--valuation-rounds", type=int, default=4)
    ap.add_argument("--valuation-fraction", type=float, default=0.2)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    ds = load_dataset(args.dataset, root=args.data_root, device=device, download=False)
    if not 0 < args.fraction <= 1:
        ap.error(f"--fraction must be in (0, 1] (got {args.fraction})")
    if args.fraction < 1:  # a fixed random subset; Flower's actors take the same one
        keep = torch.randperm(len(ds.y_train), generator=torch.Generator().manual_seed(0))
        keep = keep[: int(args.fraction * len(keep))].to(device)
        ds.x_train, ds.y_train = ds.x_train[keep], ds.y_train[keep]
    x, y = ds.x_train, ds.y_train
    torch.manual_seed(0)
    model = build_model("mlp", ds.input_shape, ds.num_classes).to(device)
    flat0 = ParamLayout(model).flat_of(model).detach().clone()
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    if "flower" in args.engines:
        try:
            import flwr
            import ray
            versions.update(flwr=flwr.__version__, ray=ray.__version__)
        except ImportError as err:
            print(f"Flower skipped: {err} (pip install 'flwr[simulation]==1.42.0')")
            args.engines = [e for e in args.engines if e != "flower"]
        logging.getLogger("flwr").setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
    dataset = ds.source.split(" from ")[0]  # the dataset's name, not where it sat
    threads = torch.get_num_threads()
    print(f"device: {device} ({device_name(device)}); " + ", ".join(f"{k} {v}" for k, v in versions.items())
          + f"; torch intra-op threads {threads}")
    print(f"FedAvg, {dataset} MLP, 1 local epoch, batch {BATCH}, lr {LR}, all clients, {len(y)} samples; "
          f"median of {args.rounds} rounds after a warm-up round")
    central = None
    if "central" in args.engines:
        t, f = run_central(model, flat0, x, y, args.rounds, device)
        central = {"seconds": statistics.median(t), "accuracy": accuracy(model, f, ds.x_test, ds.y_test, 10)}
    rows = [{"N": n, "samples_per_client": len(y) // n} for n in args.clients]
    # fedlib's engines first for every N, Flower last: Ray's actor processes (and their CUDA
    # contexts) may linger after a simulation and would slow whatever runs next
    for engine in ("vectorized", "eager", "loop", "flower"):
        for row in rows:
            n = row["N"]
            if engine not in args.engines or (engine == "loop" and n > args.skip_loop_above) or \
                    (engine == "flower" and n > args.skip_flower_above):
                continue
            if engine == "flower":
                gpus = 0.0 if device.type != "cuda" else (args.flower_gpus or 1.0 / min(n, os.cpu_count() or 1))
                t, f, startup = run_flower(args.dataset, args.data_root, flat0, n, args.rounds, device,
                                           args.flower_cpus, gpus, args.fraction)
                row["flower_startup_s"] = startup
            else:
                indices = iid(y.cpu().numpy(), n, seed=0).indices
                fn = train_clients_loop if engine == "loop" else train_clients
                mode, workers, order = ("off", 1, "vectorized") if engine == "eager" else (args.compile, args.workers, None)
                if engine == "vectorized":
                    row["vectorized_plan"] = execution_plan(
                        LocalTraining(batch_size=BATCH, compile=mode, workers=workers), n, device, model, x[0],
                        math.ceil(len(y) / n / BATCH))
                t, f = run_fedlib(fn, model, flat0, x, y, indices, args.rounds, device, mode, workers, order)
            row[f"{engine}_s"] = statistics.median(t)
            row[f"{engine}_accuracy"] = accuracy(model, f, ds.x_test, ds.y_test, 10)
    for i, row in enumerate(rows):
        if central:
            row["central_s"], row["central_accuracy"] = central["seconds"], central["accuracy"]
        print_row(row, first=i == 0)
    breakdown = (round_breakdown(args.clients, args.rounds, args.fraction, args.device, args.dataset, args.data_root)
                 if args.breakdown else [])
    valuation = (valuation_arithmetic(args.valuation_clients, args.valuation_rounds, args.valuation_fraction,
                                      args.device, args.dataset, args.data_root) if args.valuation_clients else [])
    if args.json:
        out = {"device": str(device), "device_name": device_name(device), "versions": versions,
               "dataset": dataset, "fraction": args.fraction, "rounds": args.rounds, "rows": rows, "valuation": valuation,
               "valuation_clients": args.valuation_clients, "breakdown": breakdown, "threads": threads,
               "environment": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                              "FEDLIB_COMPILE", "FEDLIB_CPU_WORKERS")},
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return rows


def print_row(row, first: bool):
    if first:
        print(f"{'N':>5} {'vec s':>7} {'eager s':>7} {'loop s':>7} {'flower s':>8} {'central s':>9} | "
              f"{'eager/vec':>9} {'loop/vec':>8} {'flower/vec':>10} {'vec/central':>11} | {'acc vec':>7} "
              f"{'eager':>6} {'loop':>6} {'flower':>6} {'central':>7} | {'Ray start s':>11} | fedlib plan")

    def s(k, fmt="{:.3f}"):
        return fmt.format(row[k]) if k in row else "-"

    def ratio(a, b):
        return f"{row[a] / row[b]:.2f}x" if a in row and b in row else "-"

    plan = row.get("vectorized_plan")
    plan = (f"{plan['step']} steps, {plan.get('order', 'vectorized')} order, {plan['workers']} worker(s) x "
            f"{plan['intra_op_threads']} thread(s)" if plan else "-")
    print(f"{row['N']:>5} {s('vectorized_s'):>7} {s('eager_s'):>7} {s('loop_s'):>7} {s('flower_s'):>8} "
          f"{s('central_s'):>9} | {ratio('eager_s', 'vectorized_s'):>9} {ratio('loop_s', 'vectorized_s'):>8} "
          f"{ratio('flower_s', 'vectorized_s'):>10} {ratio('vectorized_s', 'central_s'):>11} | "
          f"{s('vectorized_accuracy', '{:.4f}'):>7} {s('eager_accuracy', '{:.4f}'):>6} "
          f"{s('loop_accuracy', '{:.4f}'):>6} {s('flower_accuracy', '{:.4f}'):>6} {s('central_accuracy', '{:.4f}'):>7}"
          f" | {s('flower_startup_s', '{:.1f}'):>11} | {plan}", flush=True)


if __name__ == "__main__":
    main()
