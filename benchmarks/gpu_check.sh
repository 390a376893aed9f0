#!/usr/bin/env bash
# Device check for the captured (CUDA-graph) local step, in one command, on a CUDA machine:
#
#   OUT=/some/empty/dir bash benchmarks/gpu_check.sh          (OUT defaults to benchmarks/results)
#
# 1. the equality tests: the captured step against the eager engine (bit-identical on CUDA),
#    the static-buffer step, CPU worker groups (tests/core/test_population.py);
# 2. one whole round at the benchmark's shape, CUDA graph against eager steps (max |diff|);
# 3. benchmarks/peers.py --device cuda: vectorized (graph), eager, loop, Flower, centralized,
#    N = 5, 20, 100, 500, with the per-round breakdown.
# Writes $OUT/peers_<device>.json and $OUT/peers_<device>.log; machine paths are replaced by
# placeholders. Environment: PYTHON (default python), DATASET (fmnist or mnist, default fmnist),
# FEDLIB_DATA (the data root), CLIENTS (default "5 20 100 500"), ROUNDS (default 3), FRACTION
# (default 1.0). DEVICE=cpu FRACTION=0.05 CLIENTS=5 ROUNDS=1 dry-runs the script on a CPU (there the
# captured step is inductor's, compared within 1e-5, and Flower is left out).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python}
DATASET=${DATASET:-fmnist}
CLIENTS=${CLIENTS:-5 20 100 500}
ROUNDS=${ROUNDS:-3}
FRACTION=${FRACTION:-1.0}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$ROOT/benchmarks/results}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

if [ "$DEVICE" = cuda ]; then
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu_check: CUDA is not available to $PY; nothing to check" >&2
        exit 2
    fi
    SLUG=$("$PY" -c "import re, torch; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
    ENGINES="vectorized eager loop flower central"
else
    SLUG=cpu-dry-run
    ENGINES="vectorized eager loop central"
fi
LOG=$OUT/peers_$SLUG.log
RAW=$(mktemp)

scrub() {  # no machine paths in stored files: name the folders, not where they sat
    sed -e "s#$ROOT#<repo>#g" -e "s#${FEDLIB_DATA:-/nonexistent-data-root}#<data>#g" -e "s#${HOME:-/nonexistent-home}#<home>#g" \
        -e "s#$(dirname "$(command -v "$PY")")#<python>#g"
}

status=0
{
    echo "# benchmarks/gpu_check.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    "$PY" -c "import torch; print('# torch', torch.__version__, '| CUDA', torch.version.cuda, '|',
              torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"

    echo; echo "## 1. equality tests (captured step vs eager)"
    if "$PY" -c "import pytest" 2>/dev/null; then
        FEDLIB_TEST_COMPILE=1 "$PY" -m pytest tests/core/test_population.py -q -p no:cacheprovider \
            -k "compiled or static or worker or backend or vectorized_equals_loop" || status=1
    else  # no pytest on the machine: the captured-vs-eager test called directly
        echo "(pytest is not installed: running test_compiled_step_equals_eager directly)"
        "$PY" -c "import sys; sys.path[:0] = ['tests', 'tests/core']; import test_population as t; t.test_compiled_step_equals_eager(); print('test_compiled_step_equals_eager passed')" || status=1
    fi

    echo; echo "## 2. one round at the benchmark's shape: captured steps vs eager steps"
    "$PY" - "$DATASET" "$DEVICE" "$FRACTION" <<'EOF' || status=1
import sys
import torch
from fedlib.data import load_dataset
from fedlib.models import build_model
from fedlib.partition import iid
from fedlib.population import LocalTraining, ParamLayout, make_client_batches, step_backend, train_clients

dataset, device, fraction = sys.argv[1], torch.device(sys.argv[2]), float(sys.argv[3])
ds = load_dataset(dataset, device=device, download=False)
x, y = ds.x_train[: int(fraction * len(ds.y_train))], ds.y_train[: int(fraction * len(ds.y_train))]
torch.manual_seed(0)
model = build_model("mlp", ds.input_shape, ds.num_classes).to(device)
flat = ParamLayout(model).flat_of(model)
backend = step_backend(LocalTraining(compile="on"), device)
for n in ((5, 20, 100) if device.type == "cuda" else (5,)):
    idx = iid(y.cpu().numpy(), n, seed=0).indices
    b = make_client_batches(idx, 128, 1, torch.Generator().manual_seed(0))
    b.index, b.mask = b.index.to(device), b.mask.to(device)
    out = {}
    for mode in ("off", "on", "on"):  # the second "on" replays the graph captured by the first
        out[mode] = train_clients(model, flat, {}, x, y, b,
                                  LocalTraining(lr=0.1, momentum=0.9, compile=mode, workers=1))[0]
    diff = (out["on"] - out["off"]).abs().max().item()
    moved = (out["off"] - flat).abs().max().item()
    print(f"N = {n:>3}: {b.steps} steps, max |{backend} - eager| = {diff:.3g} (parameters moved up to {moved:.3g})")
    bound = 0.0 if backend == "graph" else 1e-5  # a graph replays the eager kernels; inductor may fuse
    assert diff <= bound, f"the {backend} step differs from the eager steps by {diff:.3g} > {bound}"
EOF

    echo; echo "## 3. benchmarks/peers.py --device $DEVICE"
    "$PY" benchmarks/peers.py --device "$DEVICE" --dataset "$DATASET" --clients $CLIENTS --rounds "$ROUNDS" \
        --fraction "$FRACTION" --engines $ENGINES --breakdown --json "$OUT/peers_$SLUG.json" || status=1
    echo; echo "# exit status $status"
} > "$RAW" 2>&1
scrub < "$RAW" > "$LOG"
rm -f "$RAW"
if [ -f "$OUT/peers_$SLUG.json" ]; then
    scrub < "$OUT/peers_$SLUG.json" > "$OUT/peers_$SLUG.json.tmp" && mv "$OUT/peers_$SLUG.json.tmp" "$OUT/peers_$SLUG.json"
fi
tail -n 40 "$LOG"
exit $status
