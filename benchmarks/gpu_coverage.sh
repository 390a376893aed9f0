#!/usr/bin/env bash
# GPU coverage: the top of the results queue (python -m fedlib results) on a CUDA machine in one call of
# at most 9 minutes, runs trained in packs (fedlib/packing.py: many runs as one population), and the stored
# runs brought back.
#
# 1. Prepare once, on a machine with pip access and the datasets (FEDLIB_DATA: mnist/ and
#    cifar10-jpeg/ as in the shared data folder), from the repository root:
#        benchmarks/gpu_coverage.sh prepare          (PART=cpu or all to carry MNIST as well)
#    It fills .gpu-carry/ (git-ignored): wheels of what the GPU image lacks (pydantic and its
#    needs; torch, numpy, scipy, pyyaml, matplotlib, pandas are there) and the data PART runs
#    (CIFAR-10 ~19 MB, MNIST ~11 MB), and checks it fits the device tool's 64 MiB with the tracked files.
#    Last, it prints what the call's queue would start within its budget, by the cost model's estimates
#    (fedlib results --list --budget): check that the tables wanted first are there.
# 2. Run it with the device tool (one call; the machine has no internet):
#        run(command="bash benchmarks/gpu_coverage.sh run", carry=[".gpu-carry"], timeout_s=560)
#    Optional environment, set in the command: BUDGET_S (seconds for everything: setup, preflight, the
#    queue and the benchmark; default 480; keep it 60 s under timeout_s for the machine's own start),
#    WORKERS (pack processes at a time, default 1: one pack fills the GPU), MAX_ROWS (client rows per
#    round in a pack, default 32: on an H100 a pack of 5 CELM CIFAR-10 runs (25 rows) trained the most
#    samples per second, 75 runs half as many, benchmarks/results/packed_nvidia-h100.json; each pack
#    process also bounds it by free memory), PART (gpu, cpu
#    or all; default gpu), PROFILE (default paper), ONLY (chapters), TABLES (comma-separated table labels: only
#    the runs backing them, e.g. TABLES="Precision screen"), DEVICE (default cuda),
#    BENCH_S (seconds of BUDGET_S kept for benchmarks/packed.py after the queue: first a kernel profile
#    (--top-kernels 15), then packs with and without compacted replays (FEDLIB_COMPACT; 2/3 of
#    BENCH_S), then with --cudnn-benchmark (1/3); default 0: none; BENCH_ARGS replaces its size arguments;
#    BENCH_PRECISION, default float32: the precisions its packs are measured in, e.g. "float32 bfloat16"; on CUDA
#    float32 convolutions run in TF32, cuDNN's default). The queue's packs
#    take the lowering timed fastest per shape (FEDLIB_CONV=auto; native won every shape on an H100,
#    4-5x faster than matmul, benchmarks/results/packed_conv_nvidia-h100.json).
#    PRECISION (float32 or bfloat16; default float32): local training's precision the preflight checks its
#    paths in (captured steps, lowerings, packing, the methods; RunConfig.precision). The queue's runs keep
#    their configs' precision (a chapter declares it; whether CIFAR-10 runs adopt bfloat16 is the screen's call).
#    Steps: a preflight of at most 30 s (benchmarks/preflight.py: captured steps, packing, each method
#    once; a failing path falls back to eager steps or to unpacked runs, in one line), then the packs,
#    most valuable first, until the budget; GPU utilisation sampled every 2 s.
#    Every run finished goes into $OUT/runs.tar within 10 s (one file: the device tool brings back at most 8),
#    so a call cut off by its timeout still brings back each finished run.
# 3. Copy what came back into the repository (files_at: the folder the tool names), commit:
#        tar -xf <files_at>/runs.tar -C results/runs --skip-old-files
#    <files_at>/gpu_coverage.log holds the preflight, the queue's progress, the runs stored per
#    device-minute and the GPU utilisation.
#
# Order (fedlib/app/queue.py, --first): the precision screens (issue 45, both stored), seed 0 of the CIFAR-10
# readings screens (CELM, then FedMS: FedAvg under each candidate recipe, issue 30; the chosen reading decides
# whether earlier CIFAR-10 runs stay current), then FedMS Table 1 (CIFAR-10: one FedMS run stored so far, and a float32
# FedMS run is the slowest CIFAR-10 run on a CPU), CELM Table 1 (CIFAR-10 rows), FLCE (its CIFAR-10 headline row first),
# FedSCM Table 2; then the rest. Seeds 1-2 of a table join its packs. tests/app/test_gpu_script.py rehearses
# this script on the CPU (DEVICE=cpu) and checks its --first labels against the queue.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu-carry
FIRST=(--first "celm:Precision screen" "fedms:Precision screen" "celm:CIFAR-10 readings" "fedms:CIFAR-10 readings" "fedms:Table 1"
       "celm:Table 1" flce "fedscm:Table 2")

prepare() {
    local py="${PYTHON:-python3}" data="${FEDLIB_DATA:?set FEDLIB_DATA to the data root holding mnist/ and cifar10-jpeg/}"
    mkdir -p "$CARRY/whl"
    local wheels=()
    for name in pydantic pydantic_core annotated-types typing-inspection typing_extensions; do
        wheels+=("$name==$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
    done
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$CARRY/whl" "${wheels[@]}"
    rm -rf "$CARRY/data/mnist" "$CARRY/data/cifar10-jpeg"  # only what PART runs: the tool carries 64 MiB in all
    case "${PART:-gpu}" in
        gpu) mkdir -p "$CARRY/data/cifar10-jpeg"; cp "$data"/cifar10-jpeg/cifar10-jpeg.tar.gz "$CARRY/data/cifar10-jpeg/" ;;
        cpu) mkdir -p "$CARRY/data/mnist"; cp "$data"/mnist/*-ubyte.gz "$CARRY/data/mnist/" ;;
        *) mkdir -p "$CARRY/data/mnist" "$CARRY/data/cifar10-jpeg"; cp "$data"/mnist/*-ubyte.gz "$CARRY/data/mnist/"
           cp "$data"/cifar10-jpeg/cifar10-jpeg.tar.gz "$CARRY/data/cifar10-jpeg/" ;;
    esac
    local tracked carried
    tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    carried=$(du -sb "$CARRY" | cut -f1)
    echo "carry $(( carried / 1048576 )) MiB + tracked files $(( tracked / 1048576 )) MiB (the device tool takes 64 MiB in all)"
    [ $(( carried + tracked )) -lt $(( 64 * 1048576 )) ] || { echo "too large for the device tool" >&2; return 1; }
    # the stored runs are tracked and travel too: how many more fit, at their mean size
    local runs run_bytes
    runs=$(git ls-files results/runs | wc -l)
    run_bytes=$(git ls-files -z results/runs | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    [ "$runs" -gt 0 ] && echo "stored runs: $runs, $(( run_bytes / runs / 1024 )) KiB each on average; room for about" \
        "$(( (64 * 1048576 - carried - tracked) / (run_bytes / runs) )) more before the working tree is too large"
    # what the call's queue will start, by the estimates, seen before device time is spent: its budget as
    # run_on_device computes it, with setup and preflight at 30 s (24-28 s in the logs of earlier calls)
    local budget=$(( (${BUDGET_S:-480} - ${BENCH_S:-0} - 30 - 5) * 10 / 11 )) part=(--gpu-only) tables=()
    case "${PART:-gpu}" in cpu) part=(--cpu-only) ;; all) part=() ;; esac
    [ -n "${TABLES:-}" ] && { IFS=',' read -ra tables <<< "$TABLES"; tables=(--table "${tables[@]}"); }
    FEDLIB_DOWNLOAD=0 "$py" -m fedlib results --list --summary "${part[@]}" "${tables[@]}" --profile "${PROFILE:-paper}" \
        --device "${DEVICE:-cuda}" --pack "${PACK:-on}" --max-rows "${MAX_ROWS:-32}" --budget "$budget" "${FIRST[@]}" \
        | sed -n '/^packs:/,$p'
}

run_on_device() {
    local t0 out="${OUT:?run this through the device tool: \$OUT is where results go back}"
    local device="${DEVICE:-cuda}" budget="${BUDGET_S:-480}" bench="${BENCH_S:-0}" results="${WORK:-/tmp/gpu}/results"
    local sampler="" snapshots=""
    case "${PRECISION:-float32}" in float32 | bfloat16) ;; *) echo "PRECISION: must be float32 or bfloat16" \
        "(got ${PRECISION})" >&2; return 1 ;; esac
    t0=$(date +%s)
    if compgen -G "$CARRY/whl/*.whl" >/dev/null && ! python3 -c "import pydantic" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "$CARRY"/whl/*.whl
    fi
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" FEDLIB_DATA="${FEDLIB_DATA:-$PWD/$CARRY/data}" \
        FEDLIB_CACHE="${FEDLIB_CACHE:-/tmp/fedlib-cache}" FEDLIB_DOWNLOAD=0 FEDLIB_RESULTS="$results" PYTHONUNBUFFERED=1
    mkdir -p "$FEDLIB_RESULTS/runs"
    # at most 8 files come back from $OUT (the 2026-11-27 second call lost 5 of 9 runs stored one file each):
    # the runs go back as one archive, rewritten whole every 10 s and renamed into place, so a call cut off
    # by its timeout still brings back every run finished 10 s before
    # the runs the repository already stores are the queue's stored runs there too (copies keeping their
    # times; the store reads no links): only files written after the marker go back
    if [ -d results/runs ]; then
        find results/runs -maxdepth 1 -type f -name '*.json*' ! -name '.*' -exec cp -p -t "$FEDLIB_RESULTS/runs" {} +
    fi
    touch "$FEDLIB_RESULTS/.started"
    snapshot() {  # finished runs only: a run being written is a hidden .tmp file until it is renamed
        (cd "$FEDLIB_RESULTS/runs" && find . -maxdepth 1 -type f -newer "$FEDLIB_RESULTS/.started" -name '*.json*' ! -name '.*' -print0 \
            | tar --null -T - -cf "$out/runs.tar.part") && mv -f "$out/runs.tar.part" "$out/runs.tar"
    }
    ( while sleep 10; do snapshot || true; done ) &
    snapshots=$!
    if [ "$device" != cpu ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms 2000 \
            > "$out/gpu_utilisation.csv" 2>/dev/null &
        sampler=$!
    fi
    {
        [ "$device" = cpu ] || nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
        python3 -c "import sys, torch; print('torch', torch.__version__); \
sys.exit(0 if sys.argv[1] == 'cpu' or torch.cuda.is_available() else 'no CUDA device')" "$device"
        python3 benchmarks/preflight.py --device "$device" --budget "${PREFLIGHT_S:-30}" --env /tmp/preflight.env \
            --precision "${PRECISION:-float32}"
        set -a; . /tmp/preflight.env; set +a
        # the queue stops runs at its budget x 1.1 + 5 s (fedlib.app.queue.run_queue's grace): what is left after
        # setup and the benchmark's share, less that grace, so the whole call ends within BUDGET_S
        local left=$(( (budget - bench - ($(date +%s) - t0) - 5) * 10 / 11 ))
        [ "$left" -gt 0 ] || left=1
        local only=() part=() first=("${FIRST[@]}") tables=()
        [ -n "${ONLY:-}" ] && only=(--only ${ONLY}) && first=()  # the order within the chapters named
        [ -n "${TABLES:-}" ] && { IFS=',' read -ra tables <<< "$TABLES"; tables=(--table "${tables[@]}"); first=(); }
        case "${PART:-gpu}" in gpu) part=(--gpu-only) ;; cpu) part=(--cpu-only) ;; esac
        echo "setup and preflight took $(( $(date +%s) - t0 )) s; queue budget ${left} s"
        python3 -m fedlib results "${part[@]}" "${only[@]}" "${tables[@]}" --profile "${PROFILE:-paper}" --device "$device" \
            --workers "${WORKERS:-1}" --budget "$left" --pack "${PACK:-on}" --max-rows "${MAX_ROWS:-32}" \
            "${first[@]}" || true
        local stored seconds
        stored=$(find "$FEDLIB_RESULTS/runs" -maxdepth 1 -type f -newer "$FEDLIB_RESULTS/.started" \( -name '*.json' -o -name '*.json.gz' -o -name '*.json.zd' \) | wc -l)
        seconds=$(( $(date +%s) - t0 ))
        python3 -c "import sys; n, s = int(sys.argv[1]), max(1, int(sys.argv[2])); \
print(f'runs stored: {n} in {s / 60:.2f} device-minutes (this script; add the machine start): {n / (s / 60):.2f} per minute')" \
            "$stored" "$seconds"
        snapshot || true
        if [ "$bench" -gt 0 ]; then  # each writes its JSON after every row, so a timeout keeps rows
            local first_s=$(( bench * 2 / 3 )) bench_args=(${BENCH_ARGS:---sizes 1 5 25 75 --rounds 2 --fraction 0.2 --repeats 1})
            timeout "$first_s" python3 benchmarks/packed.py --device "$device" "${bench_args[@]}" --conv native \
                --compact on off --precision ${BENCH_PRECISION:-float32} \
                --top-kernels 15 --json "$out/packed_${device}.json" || echo "packed benchmark: stopped or failed (exit $?)"
            timeout "$(( bench - first_s ))" python3 benchmarks/packed.py --device "$device" "${bench_args[@]}" \
                --cudnn-benchmark --json "$out/packed_${device}_cudnn_benchmark.json" \
                || echo "packed benchmark (cuDNN timed): exit $?"
        fi
        if [ -n "$sampler" ]; then
            kill "$sampler" 2>/dev/null || true
            python3 -c "import csv, sys; rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) == 2]; \
u = [float(r[0]) for r in rows]; m = [float(r[1]) for r in rows]; \
print(f'GPU utilisation: mean {sum(u) / max(1, len(u)):.0f} %, max {max(u, default=0):.0f} % over {len(u)} samples; ' \
      f'memory used up to {max(m, default=0):.0f} MiB')" "$out/gpu_utilisation.csv" || true
        fi
    } 2>&1 | tee "$out/gpu_coverage.log"
    kill "$snapshots" 2>/dev/null || true
    snapshot || true
}

case "${1:-}" in
    prepare) prepare ;;
    run) run_on_device ;;
    *) echo "usage: $0 prepare | run   (see the header)" >&2; exit 2 ;;
esac
