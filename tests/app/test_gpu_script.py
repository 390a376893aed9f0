"""The GPU call's script (benchmarks/gpu_coverage.sh) rehearsed on the CPU: preflight, packed queue,
stored runs and the log that come back under $OUT. What the device runs, the CI runs first."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_gpu_script_runs_packs_on_the_cpu_and_brings_back_stored_runs(tmp_path):
    from fedlib.data import data_missing

    if data_missing("fmnist"):
        pytest.skip("Fashion-MNIST is not on this machine")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "WORK": str(tmp_path / "work"), "DEVICE": "cpu", "BUDGET_S": "300", "PROFILE": "smoke", "ONLY": "fedavg", "PART": "cpu",
           "PREFLIGHT_S": "3", "OUT": str(out), "BENCH_S": "120", "MAX_ROWS": "64",
           "PRECISION": "bfloat16", "BENCH_PRECISION": "float32 bfloat16",
           "BENCH_ARGS": "--sizes 1 --rounds 1 --fraction 0.004 --test-samples 50 --models mlp",
           "FEDLIB_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "benchmarks/gpu_coverage.sh", "run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    log = (out / "gpu_coverage.log").read_text()
    assert done.returncode == 0, log[-2000:] + done.stderr[-2000:]
    assert "preflight: captured steps ok" in log and "preflight: packing ok" in log
    assert "preflight: fedscm pipeline ok" in log and "preflight: fedscm packing ok" in log and "FAILED" not in log
    assert "preflight: convolution lowerings ok" in log and "preflight: compacted replays ok" in log
    assert "packs: 1 pack(s) of 10 runs (at most 64 client rows per round)" in log
    assert "runs stored: 10 in" in log and "per minute" in log
    for name in ("packed_cpu.json", "packed_cpu_cudnn_benchmark.json"):  # the benchmark after the queue
        record = json.loads((out / name).read_text())
        assert record["rows"][0]["pack_size"] == 1
    assert json.loads((out / "packed_cpu.json").read_text())["top_kernels"]
    rows = json.loads((out / "packed_cpu.json").read_text())["rows"]
    assert [(r["conv"], r["compact"], r["precision"]) for r in rows] == [
        (c, k, p) for p in ("float32", "bfloat16") for c, k in (("native", "on"), ("native", "off"))]
    assert set(json.loads((out / "packed_cpu.json").read_text())["top_kernels_by_precision"]) == {"float32", "bfloat16"}
    from fedlib.provenance import environment

    assert set(environment("cpu")) <= set(json.loads((out / "packed_cpu.json").read_text()))  # one provenance shape
    # the runs come back as one archive (the device tool brings back at most 8 files), rewritten as runs finish
    import tarfile

    from fedlib.cache import zd_decompress

    assert len(list(out.rglob("*"))) <= 8 and not (out / "runs.tar.part").exists()
    with tarfile.open(out / "runs.tar") as archive:
        members = [m for m in archive.getmembers() if m.isfile()]
        assert len(members) == 10 and all(m.name.endswith(".json.zd") for m in members)
        payload = json.loads(zd_decompress(archive.extractfile(members[0]).read()))
    # one budget for everything: the queue gets what setup and the benchmark leave, less the queue's grace
    queue_budget = int(log.split("queue budget ")[1].split(" s")[0])
    assert 0 < queue_budget <= (300 - 120 - 5) * 10 // 11
    meta = payload["payload"]["result"]["meta"] if "payload" in payload else payload["result"]["meta"]
    assert meta["pack"]["size"] == 10


def test_the_gpu_scripts_first_labels_name_tables_of_the_queue():
    """A misspelt ``--first`` label would end the device call in its first second: check them here."""
    import re
    import shlex

    from fedlib.app import queue

    script = (ROOT / "benchmarks" / "gpu_coverage.sh").read_text()
    words = shlex.split(re.search(r"FIRST=\(--first (.*?)\)", script, re.S).group(1).replace("\\\n", " "))
    first = [tuple(w.split(":", 1)) if ":" in w else (w, None) for w in words]
    assert first[:5] == [("celm", "Precision screen"), ("fedms", "Precision screen"), ("celm", "CIFAR-10 readings"),
                         ("fedms", "CIFAR-10 readings"), ("fedms", "Table 1")]
    queue._check_labels(queue.all_items("paper"), None, first)  # raises on a label the queue lacks
    with pytest.raises(ValueError, match="has no table 'Table 99'"):
        queue._check_labels(queue.all_items("paper"), None, [("celm", "Table 99")])
