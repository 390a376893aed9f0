#!/usr/bin/env bash
# GPU coverage: run the top of the GPU part of the results queue (python -m fedlib results) on a
# CUDA machine for at most 9 minutes, several runs sharing the GPU, and bring the stored runs back.
#
# 1. Prepare once, on a machine with pip access and the datasets (FEDLIB_DATA: mnist/ and
#    cifar10-jpeg/ as in the shared data folder), from the repository root:
#        benchmarks/gpu_coverage.sh prepare
#    It fills .gpu-carry/ (git-ignored): wheels of what the GPU image lacks (pydantic and its
#    needs; torch, numpy, scipy, pyyaml, matplotlib, pandas are there) and the datasets (~30 MB).
# 2. Run it with the device tool (one call; the machine has no internet):
#        run(command="bash benchmarks/gpu_coverage.sh run", carry=[".gpu-carry"], timeout_s=600)
#    Optional environment, set in the command: WORKERS (default 6), BUDGET_S (seconds for the
#    queue, default 480), e.g. command="WORKERS=8 bash benchmarks/gpu_coverage.sh run".
# 3. Unpack what came back into the repository (files_at: the folder the tool names), commit:
#        tar -xzf <files_at>/gpu_results.tar.gz      # adds results/runs/<key>.json
#    <files_at>/gpu_coverage.log holds the queue's progress and the runs stored per device-minute.
#
# Order (fedlib/queue.py, --first): seed 0 of CELM Table 1 (CIFAR-10 rows), FedMS Table 1
# (CIFAR-10), FLCE (its CIFAR-10 headline row first), FedSCM Table 2; then the rest of the GPU
# queue. A run whose estimated cost does not fit the time left is not started.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu-carry

prepare() {
    local py="${PYTHON:-python3}" data="${FEDLIB_DATA:?set FEDLIB_DATA to the data root holding mnist/ and cifar10-jpeg/}"
    mkdir -p "$CARRY/whl" "$CARRY/data/mnist" "$CARRY/data/cifar10-jpeg"
    local wheels=()
    for name in pydantic pydantic_core annotated-types typing-inspection typing_extensions; do
        wheels+=("$name==$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
    done
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$CARRY/whl" "${wheels[@]}"
    cp "$data"/mnist/*-ubyte.gz "$CARRY/data/mnist/"
    cp "$data"/cifar10-jpeg/cifar10-jpeg.tar.gz "$CARRY/data/cifar10-jpeg/"
    du -sh "$CARRY"
}

run_on_device() {
    local t0 out="${OUT:?run this through the device tool: \$OUT is where results go back}"
    t0=$(date +%s)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$CARRY"/whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD" FEDLIB_DATA="$PWD/$CARRY/data" FEDLIB_CACHE=/tmp/fedlib-cache \
        FEDLIB_DOWNLOAD=0 FEDLIB_RESULTS=/tmp/gpu/results PYTHONUNBUFFERED=1
    mkdir -p "$FEDLIB_RESULTS"
    {
        nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
        python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__)"
        # decode the CIFAR-10 JPEG copy once; the workers read the decoded cache
        python3 -c "from fedlib.data import load_dataset; load_dataset('cifar10'); load_dataset('mnist')"
        local left=$(( ${BUDGET_S:-480} - ($(date +%s) - t0) ))
        echo "setup took $(( $(date +%s) - t0 )) s; queue budget ${left} s"
        python3 -m fedlib results --gpu-only --device cuda --workers "${WORKERS:-6}" --budget "$left" \
            --first "celm:Table 1" "fedms:Table 1" flce "fedscm:Table 2" || true
        local stored minutes
        stored=$(find "$FEDLIB_RESULTS" -name '*.json' | wc -l)
        minutes=$(python3 -c "import sys; print(f'{(int(sys.argv[1])) / 60:.2f}')" "$(( $(date +%s) - t0 ))")
        echo "runs stored: $stored in ${minutes} device-minutes (this script; add the machine's start):" \
             "$(python3 -c "import sys; print(f'{int(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$stored" "$minutes") per minute"
    } 2>&1 | tee "$out/gpu_coverage.log"
    tar -czf "$out/gpu_results.tar.gz" -C /tmp/gpu results
}

case "${1:-}" in
    prepare) prepare ;;
    run) run_on_device ;;
    *) echo "usage: $0 prepare | run   (see the header)" >&2; exit 2 ;;
esac
