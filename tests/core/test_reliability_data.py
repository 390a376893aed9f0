"""Reliability: reading data safely. No unsafe loader in the sources; truncated archives, a bad gzip CRC, a
tampered dataset cache, FIFOs, devices and unreadable files are caught, in one line (issues 15, 33)."""

import errno
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from reliability_common import ROOT, warnings_allowed

from fedlib.data import load_dataset
from fedlib.data_files import DataCorruptError


def test_nothing_loads_unsafely():
    sources = {p: p.read_text() for p in (ROOT / "fedlib").rglob("*.py")}
    sources.update({p: p.read_text() for p in (ROOT / "benchmarks").rglob("*.py")})
    for path, text in sources.items():
        assert "import pickle" not in text and "cloudpickle" not in text, path
        assert not re.search(r"yaml\.load\(", text), f"{path}: use yaml.safe_load"
        assert not re.search(r"allow_pickle\s*=\s*True", text), path
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, f"{path}: {call}"
        assert not re.search(r"(?<![\w.])(eval|exec)\(", text), f"{path}: eval/exec"


def _png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (8, 8), value).save(buffer, format="PNG")
    return buffer.getvalue()


def _image_tar(path: Path, compress: bool) -> list[tuple[str, bytes]]:
    members = [(f"{split}/{cls}/{i}.png", _png(40 * i + (100 if cls == "b" else 0)))
               for split in ("train", "test") for cls in ("a", "b") for i in range(4)]
    with tarfile.open(path, "w:gz" if compress else "w") as archive:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return members


def test_15_6_truncated_archives_and_bad_gzip_crc_are_detected(tmp_path):
    whole = tmp_path / "whole.tar"
    _image_tar(whole, compress=False)
    assert len(load_dataset(f"imagefolder:{whole}", cache_dir=tmp_path / "c").y_test) == 8
    cut = tmp_path / "cut.tar"  # cut at a member boundary: the test set keeps 2 images of class a
    with tarfile.open(whole) as archive:
        tenth = [m for m in archive.getmembers()][10]
    cut.write_bytes(whole.read_bytes()[:tenth.offset])
    with pytest.raises(DataCorruptError, match="truncated|no image of class"):
        load_dataset(f"imagefolder:{cut}", cache_dir=tmp_path / "c")
    gz = tmp_path / "data.tar.gz"
    _image_tar(gz, compress=True)
    damaged = bytearray(gz.read_bytes())
    damaged[-8] ^= 0xFF  # the gzip trailer's CRC32
    bad = tmp_path / "crc.tar.gz"
    bad.write_bytes(bytes(damaged))
    with pytest.raises(DataCorruptError, match="CRC"):
        load_dataset(f"imagefolder:{bad}", cache_dir=tmp_path / "c")


def test_15_10_the_npz_dataset_cache_is_checked_against_its_source(tmp_path):
    tree = tmp_path / "tree"
    for split in ("train", "test"):
        for cls, value in (("a", 10), ("b", 200)):
            (tree / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.new("L", (8, 8), value + i).save(tree / split / cls / f"{i}.png")
    name = f"imagefolder:{tree}"
    first = load_dataset(name, cache_dir=tmp_path / "cache")
    (cache_file,) = (tmp_path / "cache").glob("*.npz")
    with np.load(cache_file, allow_pickle=False) as npz:
        fields = {k: npz[k] for k in npz.files}
    fields["y_train"] = 1 - fields["y_train"]  # self-consistent but wrong labels, every other field kept
    with open(cache_file, "wb") as fh:
        np.savez(fh, **fields)
    with warnings_allowed():
        again = load_dataset(name, cache_dir=tmp_path / "cache")
    assert torch.equal(again.y_train, first.y_train) and torch.equal(again.x_train, first.x_train)


_DATA_PATHS = """
import io, json, os, sys
from contextlib import redirect_stderr
from fedlib.__main__ import main
out = []
for path in sys.argv[2:]:
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["run", sys.argv[1], f"dataset=imagefolder:{path}"])
    out.append([code, err.getvalue()])
print(json.dumps(out))
"""


def test_33_7_fifos_devices_and_dev_paths_are_refused_in_one_line(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("n_clients: 3\nrounds: 1\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    paths = [tmp_path / "fifo", "/dev/zero", tmp_path / "zero", "/dev/null"]
    env = {**os.environ, "FEDLIB_CACHE": str(tmp_path / "cache")}
    try:  # a reader that opens them blocks (FIFO) or reads forever (/dev/zero): a time limit
        done = subprocess.run([sys.executable, "-c", _DATA_PATHS, str(config), *map(str, paths)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a special data path blocked or read forever")
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for path, (code, err) in zip(paths, results):
        assert code == 2 and err.startswith("fedlib: ") and err.count("\n") == 1, (path, err)
        assert str(path) in err and "refused" in err


def test_33_7_a_permission_error_is_one_line_naming_the_path(tmp_path, monkeypatch):
    import fedlib.data_files
    from fedlib.data_files import DataNotFoundError

    _image_tar(tmp_path / "tree.tar", compress=False)
    secret = tmp_path / "tree.tar"

    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(fedlib.data_files, "_file_sha256", denied)
    with pytest.raises(DataNotFoundError) as info:
        load_dataset(f"imagefolder:{secret}", cache_dir=tmp_path / "c")
    assert "\n" not in str(info.value) and str(secret) in str(info.value) and "permission denied" in str(info.value)
