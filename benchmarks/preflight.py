"""Preflight of a device call: every code path the queue will take, once, on the device, in seconds.

    python benchmarks/preflight.py --device cuda --budget 30 --env preflight.env

1. captured steps (a CUDA graph on CUDA): a tiny federation trained with the captured step and eagerly
   must agree; if capture fails or disagrees, the queue runs eager steps (``FEDLIB_COMPILE=off``);
2. convolutions as unfold + matmul (``fedlib.layers.Conv2d``; on CUDA the lowering is chosen by timing
   each shape's captured step): a tiny CNN trained so must agree with the native convolution to 5e-3
   relative (cuDNN convolutions use TF32); if not, ``FEDLIB_CONV=native``;
3. packing: two tiny runs packed must make the selections they make alone; if not, ``PACK=off``;
4. each registered method once (one tiny round on synthetic data), in the queue's order of need, until
   the budget: a failing method is named in one line (its queue runs will fail the same way).

``--precision bfloat16`` (the GPU script's ``PRECISION``) runs every check with local training under bfloat16
autocast (``RunConfig.precision``), the captured and eager steps then agreeing within
``fedlib.determinism.BFLOAT16``; the default, float32, checks what it always did.

Each finding is one line on stdout; the fallbacks go to ``--env`` as shell assignments the GPU script
sources. Exits 0 whatever it finds: the point is to choose the paths, not to stop the call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from fedlib.config import make_config  # noqa: E402
from fedlib.determinism import BFLOAT16  # noqa: E402
from fedlib.methods import METHODS  # noqa: E402
from fedlib.methods.base import Method  # noqa: E402

TINY = dict(dataset="synthetic", fraction=0.1, test_samples=100, model="mlp", n_clients=4, rounds=2,
            batch_size=16, lr=0.05, split={"name": "dirichlet", "alpha": 0.5}, seed=0)
FAMILIES_FIRST = ("fedavg", "celm", "cffl", "cgsv", "shapfed", "fedms", "greedyfed", "flce", "moon", "ditto",
                  "logit_uwa", "logit_meta", "fedscm_select", "cohort")


TINY_METHOD = {"logit_meta": {"meta_labeled": 50}}  # within the tiny config's 60 public samples
PRECISION = "float32"  # --precision: local training's precision in every check


def tiny(name: str, device: str, **changes):
    extra = {"server_val": 60} if METHODS[name].needs_validation else {}
    method = {"name": name, **TINY_METHOD.get(name, {})}
    if METHODS[name].select_clients is not Method.select_clients:
        extra.update(clients_per_round=2)
    try:
        return make_config(TINY, method=method, device=device, precision=PRECISION, **extra, **changes)
    except Exception:  # a method that needs every client each round
        extra.pop("clients_per_round", None)
        return make_config(TINY, method=method, device=device, precision=PRECISION, **extra, **changes)


def check_capture(device: str, compact: bool = False) -> str | None:
    """None when the captured step gives the eager step's numbers, else why not. With ``compact``, the
    replays of only the clients with samples (two clients of unequal size: the second trains alone at
    the end of each epoch)."""
    from fedlib.population import LocalTraining, make_client_batches
    from fedlib.training import train_clients

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 3)).to(device)
    x, y = torch.randn(64, 12, device=device), torch.randint(0, 3, (64,), device=device)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    batches = make_client_batches([torch.arange(20).numpy(), torch.arange(20, 50).numpy()], 8, 2,
                                  torch.Generator().manual_seed(0))
    batches.index, batches.mask = batches.index.to(device), batches.mask.to(device)
    eager, _ = train_clients(model, flat, {}, x, y, batches, LocalTraining(batch_size=8, lr=0.1, momentum=0.9,
                                                                            compile="off", workers=1,
                                                                            precision=PRECISION))
    mode = "auto" if torch.device(device).type == "cuda" else "off"
    captured, _ = train_clients(model, flat, {}, x, y, batches, LocalTraining(batch_size=8, lr=0.1, momentum=0.9,
                                                                               compile=mode, workers=1,
                                                                               balance=compact, precision=PRECISION))
    diff = float((captured - eager).abs().max())
    bound = 1e-5 if PRECISION == "float32" else BFLOAT16.parameters * float(eager.abs().max())
    return None if diff <= bound else f"captured and eager steps differ by {diff:.2e}"


def check_conv(device: str) -> str | None:
    """None when a tiny CNN trains to the same parameters under both convolution lowerings (the
    timed choice included, on CUDA), else why not."""
    from fedlib.models import build_model
    from fedlib.population import LocalTraining, ParamLayout, make_client_batches, stack_buffers
    from fedlib.training import conv_lowering_for, train_clients

    torch.manual_seed(0)
    model = build_model("cnn", (3, 16, 16), 10).to(device)
    layout = ParamLayout(model)
    x, y = torch.randn(96, 3, 16, 16, device=device), torch.randint(0, 10, (96,), device=device)
    batches = make_client_batches([torch.arange(i * 24, (i + 1) * 24).numpy() for i in range(4)], 8, 1,
                                  torch.Generator().manual_seed(0)).to(device)
    bufs = stack_buffers(layout.buffers_of(model), 1)
    start = layout.flat_of(model)
    trained = {}
    for conv in ("native", "matmul", "auto"):
        cfg = LocalTraining(batch_size=8, lr=0.05, momentum=0.9, workers=1, conv=conv, precision=PRECISION)
        trained[conv], _ = train_clients(model, start, bufs, x, y, batches, cfg)
    chosen = conv_lowering_for(model, layout, x, y, 4, 8, bufs, LocalTraining(batch_size=8, momentum=0.9, workers=1,
                                                                                conv="auto", precision=PRECISION))
    scale = float(trained["native"].abs().max())
    for conv in ("matmul", "auto"):
        diff = float((trained[conv] - trained["native"]).abs().max()) / scale
        if not diff <= 5e-3:
            return f"{conv} convolutions differ from native by {diff:.2e} (relative)"
    print(f"preflight: convolution lowering chosen for a 4-client CNN step: {chosen}", flush=True)
    return None


def check_packing(device: str) -> str | None:
    from fedlib.run import run_many

    configs = [tiny("fedavg", device, seed=s) for s in (0, 1)]
    alone = run_many(configs, cache=False, progress=False)
    packed = run_many(configs, cache=False, progress=False, pack=True)
    for a, b in zip(alone, packed):
        if [h["aggregated"] for h in a.history] != [h["aggregated"] for h in b.history]:
            return "a packed run selected other clients than alone"
        if abs(a.final["accuracy"] - b.final["accuracy"]) > 0.02:
            return f"packed accuracy {b.final['accuracy']:.3f} vs alone {a.final['accuracy']:.3f}"
    return None


def check_scm_pipeline(device: str) -> str | None:
    """FedSCM's one-shot pipeline (its own runner, not the engine) end to end on a tiny federation."""
    from fedlib.config import ScmConfig
    from fedlib.data import load_dataset
    from fedlib.scm_pipeline import execute

    data = load_dataset("synthetic", num_classes=4, image_shape=(1, 8, 8), n_train=1200, n_test=400, seed=0)
    config = ScmConfig.make({"dataset": "synthetic", "model": "mlp", "n_clients": 12, "alpha": 0.5,
                             "server_samples": 60, "eval_samples": 80, "batch_size": 32, "post_rounds": 1,
                             "gammas": (0.67,), "random_sizes": (3,), "sdea_clients": 3, "fedavg_per_round": 4,
                             "stability_runs": 2, "expertise_repeats": 1, "temperatures": (1.0,), "adapt_steps": 1,
                             "ot_samples": 10, "cf_permutations": 2, "device": device})
    result = execute(config, data)
    return None if result.get("methods") else "no method results"


def check_scm_packing(device: str) -> str | None:
    """Two FedSCM federations run together (one-shot stages and post-trainings packed) select as alone."""
    from fedlib.config import ScmConfig
    from fedlib.data import load_dataset
    from fedlib.scm_pipeline import execute, execute_many

    data = load_dataset("synthetic", num_classes=4, image_shape=(1, 8, 8), n_train=1200, n_test=400, seed=0)
    configs = [ScmConfig.make({"dataset": "synthetic", "model": "mlp", "n_clients": 12, "alpha": 0.5, "seed": seed,
                               "server_samples": 60, "eval_samples": 80, "batch_size": 32, "post_rounds": 1,
                               "gammas": (0.67,), "methods": ("fedscm", "random"), "random_sizes": (3,),
                               "stability_runs": 0, "expertise_repeats": 0, "device": device}) for seed in (0, 1)]
    for alone, together in zip([execute(c, data) for c in configs], execute_many(configs, data)):
        if alone["selections"]["0.67"]["selected"] != together["selections"]["0.67"]["selected"]:
            return "a federation run together selected other clients than alone"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds for the whole preflight")
    parser.add_argument("--env", type=Path, help="write the fallbacks here as shell assignments")
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                        help="local training's precision in every check (RunConfig.precision)")
    args = parser.parse_args(argv)
    global PRECISION
    PRECISION = args.precision
    t0 = time.perf_counter()
    env: list[str] = []

    def step(what: str, check, fallback: str | None = None) -> None:
        t = time.perf_counter()
        try:
            why = check()
        except Exception as err:  # noqa: BLE001 - any failure is a finding, reported in one line
            why = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
        took = time.perf_counter() - t
        if why is None:
            print(f"preflight: {what} ok ({took:.1f} s)", flush=True)
        else:
            print(f"preflight: {what} FAILED ({why})" + (f"; falling back: {fallback}" if fallback else ""),
                  flush=True)
            if fallback:
                env.append(fallback)

    step("captured steps", lambda: check_capture(args.device), "FEDLIB_COMPILE=off")
    if "FEDLIB_COMPILE=off" in env:
        os.environ["FEDLIB_COMPILE"] = "off"
    else:
        step("compacted replays", lambda: check_capture(args.device, compact=True), "FEDLIB_COMPACT=off")
        if "FEDLIB_COMPACT=off" in env:
            os.environ["FEDLIB_COMPACT"] = "off"
    step("convolution lowerings", lambda: check_conv(args.device), "FEDLIB_CONV=native")
    if "FEDLIB_CONV=native" in env:
        os.environ["FEDLIB_CONV"] = "native"
    step("packing", lambda: check_packing(args.device), "PACK=off")
    step("fedscm pipeline", lambda: check_scm_pipeline(args.device))
    step("fedscm packing", lambda: check_scm_packing(args.device), "FEDLIB_SCM_PACK=off")
    names = [n for n in FAMILIES_FIRST if n in METHODS] + sorted(set(METHODS) - set(FAMILIES_FIRST))
    checked = []
    for name in names:
        if time.perf_counter() - t0 > args.budget:
            print(f"preflight: budget reached; methods not checked: {', '.join(names[len(checked):])}", flush=True)
            break
        from fedlib.run import run

        step(f"method {name}", lambda name=name: (run(tiny(name, args.device), cache=False, progress=False), None)[1])
        checked.append(name)
    if args.env:
        args.env.write_text("".join(f"{line}\n" for line in env))
    print(f"preflight: {time.perf_counter() - t0:.1f} s; fallbacks: {', '.join(env) or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
