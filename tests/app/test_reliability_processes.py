"""Reliability: killed and signalled processes. A killed sweep keeps its finished runs and resumes, its
pool workers exit with it; the explorer stops its Voilà server and kernels on a signal, and Voilà serves
localhost only, behind a token (issues 15, 33)."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_common import ROOT

import fedlib
from fedlib.cache import ResultCache
from fedlib.config import make_config

SWEEP = """
import sys, fedlib
from fedlib.config import make_config
cfgs = [make_config(dataset="synthetic", n_clients=4, rounds=8, batch_size=8, local_epochs=3, seed=s)
        for s in range(4)]
fedlib.run_many(cfgs, progress=False)
"""


def test_killed_sweep_keeps_finished_results_and_resumes(tmp_path):
    env = {**os.environ, "FEDLIB_CACHE": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", SWEEP], env=env, cwd=ROOT)
    runs = tmp_path / "runs"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(runs.glob("*.json"))) < 1:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = sorted(runs.glob("*.json"))
    assert 1 <= len(finished) < 4, "the sweep should have been killed part-way"
    store = ResultCache(runs)
    assert all(store.get(p.stem) is not None for p in finished)  # complete, checksummed entries only
    stamps = {p.name: p.stat().st_mtime_ns for p in finished}
    # resume in-process: finished runs come from the cache, the rest are computed
    cfgs = [make_config(dataset="synthetic", n_clients=4, rounds=8, batch_size=8, local_epochs=3, seed=s)
            for s in range(4)]
    results = fedlib.run_many(cfgs, cache=store, progress=False)
    assert len(results) == 4 and len(list(runs.glob("*.json"))) == 4
    assert all((runs / name).stat().st_mtime_ns == t for name, t in stamps.items())


ORPHAN = """
import multiprocessing, sys, time
from concurrent.futures import ProcessPoolExecutor
import fedlib
from fedlib.config import make_config
pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
cfg = make_config(dataset="synthetic", n_clients=3, rounds=100000, batch_size=16, eval_every=1000, seed=5)
def report():
    while not pool._processes:
        time.sleep(0.05)
    print(*pool._processes, flush=True)
import threading
threading.Thread(target=report, daemon=True).start()
fedlib.run_many([cfg], executor=pool, cache=False, progress=False)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_15_11_pool_workers_exit_when_the_sweep_is_killed(tmp_path):
    env = {**os.environ, "FEDLIB_CACHE": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in proc.stdout.readline().split()]
    assert workers
    time.sleep(12)  # the worker has imported fedlib and is training
    assert all(_alive(pid) for pid in workers)
    proc.kill()
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.2)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:  # do not leave them behind if the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, "pool workers outlived their parent"


FAKE_VOILA = r"""
import os, socket, subprocess, sys, time
wanted = int(sys.argv[1])
busy = socket.socket(); busy.bind(("127.0.0.1", 0)); busy.listen()  # 'the asked port was taken'
port = busy.getsockname()[1]
kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[2], "w").write(f"{os.getpid()} {kernel.pid}")
print(f"[Voila] The port {wanted} is already in use, trying another port.")
print("[Voila] Voilà is running at:")
print(f"http://127.0.0.1:{port}/?token=...", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_33_5_a_signal_stops_the_explorer_its_server_and_kernels(tmp_path, sig):
    """``fedlib explore`` under SIGTERM or SIGINT stops the server and its kernel (a stand-in server
    that takes another port than asked, starts a 'kernel' and ignores nothing); the URL it printed
    has the port the server took and a token."""
    fake, pids = tmp_path / "fake_voila.py", tmp_path / "pids"
    fake.write_text(FAKE_VOILA)
    code = (f"import sys; from fedlib.app import explore; "
            f"sys.exit(explore.serve(8866, command=[sys.executable, {str(fake)!r}, '8866', {str(pids)!r}]))")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "The live explorer is at http://127.0.0.1:" in line, (line, process.stderr.read())
        server, kernel = map(int, pids.read_text().split())
        port = re.search(r":(\d+)/", line).group(1)
        assert port != "8866" and "(port 8866 was taken)" in line
        assert re.search(r"\?token=[\w-]{40,}", line)
        assert _alive(server) and _alive(kernel)
        process.send_signal(sig)
        assert process.wait(timeout=30) == 0
        assert "stopping Voilà and its kernels" in process.stderr.read()
        deadline = time.monotonic() + 10
        while (_alive(server) or _alive(kernel)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server) and not _alive(kernel)
    finally:
        if process.poll() is None:
            process.kill()


def test_33_5_voila_is_configured_for_localhost_a_token_a_host_check_and_culling(tmp_path):
    """The command line and the private config file, read back by Voilà's own parser."""
    voila_app = pytest.importorskip("voila.app")
    from fedlib.app import explore

    token = explore.new_token()
    folder = explore.write_config(token)
    try:
        assert (folder / "voila.json").stat().st_mode & 0o077 == 0  # private
        command = explore.voila_command(9999, folder)
        assert token not in " ".join(command)  # not visible in ps
        assert "--Voila.ip=127.0.0.1" in command and "--port=9999" in command and "--no-browser" in command
        app = voila_app.Voila()
        app.parse_command_line(command[1:])
        assert app.config_file_paths == [str(folder)]  # not the working folder's voila.json
        app.load_config_file("voila", path=app.config_file_paths)
        assert app.token == token and len(token) >= 40 and app.ip == "127.0.0.1" and app.open_browser is False
        assert app.tornado_settings == {"allow_remote_access": False, "local_hostnames": ["localhost"],
                                        "headers": {"Referrer-Policy": "no-referrer"}}
        kernels = app.config.MappingKernelManager
        assert kernels.cull_idle_timeout == explore.CULL_IDLE_S > 0 and kernels.cull_interval > 0
        assert kernels.cull_connected is False and kernels.cull_busy is False
    finally:
        import shutil

        shutil.rmtree(folder)


def test_33_5_voila_refuses_foreign_hosts_and_pages_without_the_token(tmp_path):
    """The real server: a DNS-rebinding Host gets 403, a page without the token goes to the login,
    and the URL has the port Voilà moved to when the asked one was taken."""
    import http.client
    import socket
    from urllib.parse import urlsplit

    from fedlib.app import explore

    try:
        explore.voila_command(0)
    except FileNotFoundError:
        pytest.skip("voila is not installed")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    asked = busy.getsockname()[1]
    log = open(tmp_path / "voila.log", "w")
    process, url = explore.start(asked, stdout=log)
    try:
        taken = urlsplit(url).port
        assert taken != asked and re.search(r"\?token=[\w-]{40,}$", url)

        def status(path, host):
            connection = http.client.HTTPConnection("127.0.0.1", taken, timeout=20)
            connection.request("GET", path, headers={"Host": host})
            return connection.getresponse().status

        assert status("/", "rebinding.example") == 403
        assert status("/", f"rebinding.example:{taken}") == 403
        assert status("/", f"127.0.0.1:{taken}") == 302  # to /login: no token, no kernel
        assert status("/", f"localhost:{taken}") == 302
    finally:
        assert explore.stop(process) == 0
        log.close()
        busy.close()
