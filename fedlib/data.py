"""Image classification datasets as normalized tensors.

``load_dataset(name)`` returns a :class:`Dataset` whose images are float32 [N, C, H, W]:
pixels scaled to [0, 1], then standardized per channel with the mean and std of the
training set (the test set uses the same statistics).

Where each dataset is read from (``root`` is the argument, else :func:`default_data_root`):

- ``fmnist``: ``/usr/share/datasets/fashion-mnist`` (Debian package dataset-fashion-mnist),
  then ``<root>/fashion-mnist``, then torchvision's ``<root>/FashionMNIST/raw``, then a
  torchvision download. Files: ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``.
- ``mnist``: ``<root>/mnist``, then ``<root>/MNIST/raw``, then a torchvision download.
- ``cifar10``: torchvision's ``<root>/cifar-10-batches-py``; if absent, the JPEG copy
  ``<root>/cifar10-jpeg/cifar10-jpeg.tar.gz`` (not pixel exact; ``source`` says so); if
  neither is there, a torchvision download.
- ``cifar100``, ``svhn``, ``emnist`` (split "balanced", 47 classes, images turned upright),
  ``eurosat``: torchvision's files under ``<root>``, downloaded there if allowed. EuroSAT has
  no official split: a stratified 80/20 train/test split with seed 0 is made, per class.
- ``imagefolder:<path>``: a directory, or a .tar.gz of one (possibly inside one top-level
  folder), holding ``train/<class>/<image>`` and ``test/<class>/<image>``; classes sorted by
  folder name; grayscale if every image is mode "L", else RGB; all images of one size.
- ``synthetic``: a seeded, learnable task (see :class:`SyntheticOptions`).

Downloads happen only inside ``load_dataset`` and only if ``download`` (default: env
``FEDLIB_DOWNLOAD``, "1" unless set to "0") is true. Missing files raise a one-line
:class:`DataNotFoundError` naming every path looked at; unreadable files raise a one-line
:class:`DataCorruptError` naming the file.

Decoded image sets (imagefolder, the CIFAR-10 JPEG copy, EuroSAT) are cached as ``.npz``
files (uint8 images [N, H, W, C], int64 labels, class names and source as unicode arrays)
under ``cache_dir``, else ``$FEDLIB_CACHE/datasets``, else ``~/.cache/fedlib/datasets``. The file
name holds a hash of the source path and the size and mtime of its files, so a changed
source gets a new cache file (old ones can be deleted by hand).

This module is the public entry (``load_dataset``, ``data_missing``, ``dataset_spec``, the fingerprints);
the readers per source are in ``fedlib.data_sources``, the errors and the cache in ``fedlib.data_files``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from . import data_sources
from .data_files import _access_errors_in_one_line, _check_arrays, _check_data_path, _content_fingerprint, _ImageArrays
from .data_files import DataAccessError, DataCorruptError, DataNotFoundError  # noqa: F401  the errors load_dataset raises
from .data_sources import (CIFAR10_JPEG, IMAGEFOLDER_PREFIX, _IDX_FOLDERS, _TORCHVISION, _idx_files, _read_cifar10,
                           _read_cifar100, _read_emnist, _read_eurosat, _read_idx_dataset, _read_imagefolder,
                           _read_svhn, _torchvision_paths)


DATASETS = ("fmnist", "mnist", "cifar10", "cifar100", "svhn", "emnist", "eurosat", "synthetic")

_SPECS = {
    "fmnist": ((1, 28, 28), 10),
    "mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
    "svhn": ((3, 32, 32), 10),
    "emnist": ((1, 28, 28), 47),
    "eurosat": ((3, 64, 64), 10),
}



@dataclass
class Dataset:
    """A train/test image classification dataset as normalized tensors."""

    name: str
    x_train: torch.Tensor = field(repr=False)
    y_train: torch.Tensor = field(repr=False)
    x_test: torch.Tensor = field(repr=False)
    y_test: torch.Tensor = field(repr=False)
    classes: list[str]
    source: str
    channel_mean: tuple[float, ...] = ()  # training statistics used to normalize, in [0, 1] units
    channel_std: tuple[float, ...] = ()
    fingerprint: dict | None = field(default=None, repr=False)  # data_fingerprint() of the files read

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])


@dataclass(frozen=True)
class SyntheticOptions:
    """Options of the ``synthetic`` dataset: a random prototype image per class plus noise.

    Prototype pixels and noise are standard normal; ``noise`` scales the noise. Labels are
    balanced. The same options give identical tensors.
    """

    num_classes: int = 10
    image_shape: tuple[int, int, int] = (1, 28, 28)
    n_train: int = 2000
    n_test: int = 500
    seed: int = 0
    noise: float = 6.0

    def __post_init__(self):
        shape = tuple(self.image_shape)
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"synthetic: image_shape must be (C, H, W), positive, got {shape}")
        if self.num_classes < 2 or min(self.n_train, self.n_test) < 1 or self.noise < 0:
            raise ValueError("synthetic: need num_classes >= 2, n_train, n_test >= 1, noise >= 0")


# ----------------------------------------------------------------------------- public API


def default_data_root() -> Path:
    """The data root: env FEDLIB_DATA if set, else ./data (relative to the working directory)."""
    configured = os.environ.get("FEDLIB_DATA")
    return Path(configured).expanduser().absolute() if configured else Path.cwd() / "data"


def dataset_spec(name: str, **kwargs) -> tuple[tuple[int, int, int], int] | None:
    """(input shape (C, H, W), number of classes) without loading; None for imagefolder."""
    if name == "synthetic":
        options = SyntheticOptions(**kwargs)
        return tuple(options.image_shape), options.num_classes
    _check_known(name)
    _reject_options(name, kwargs)
    return _SPECS.get(name)


def data_missing(dataset: str) -> str | None:
    """Why ``dataset`` cannot be loaded here (None: its files are present). No loading."""
    root = default_data_root()
    if dataset == "synthetic" or dataset.startswith(IMAGEFOLDER_PREFIX):
        return None
    places = []
    if dataset in _IDX_FOLDERS:
        places.append(root / _IDX_FOLDERS[dataset])
        if dataset == "fmnist":
            places.append(data_sources.DEBIAN_FASHION_MNIST)
    if dataset in _TORCHVISION:
        places += _torchvision_paths(dataset, root)
    if dataset == "cifar10":
        places.append(root / CIFAR10_JPEG)
    if any(p.exists() for p in places):
        return None
    return f"{dataset} data absent (looked in {', '.join(str(p) for p in places) or root})"


@_access_errors_in_one_line
def load_dataset(
    name: str,
    root: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    *,
    download: bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    **kwargs,
) -> Dataset:
    """Load dataset ``name`` (see the module docstring for names and places), normalized."""
    if name == "synthetic":
        return _make_synthetic(SyntheticOptions(**kwargs), device)
    _check_known(name)
    _reject_options(name, kwargs)
    if name.startswith(IMAGEFOLDER_PREFIX):
        arrays = _read_imagefolder(name[len(IMAGEFOLDER_PREFIX):], cache_dir)
    else:
        data_root = Path(root).expanduser().absolute() if root is not None else default_data_root()
        arrays = _READERS[name](data_root, _download_allowed(download), cache_dir)
    dataset = _to_dataset(name, arrays, device)
    dataset.fingerprint = data_fingerprint(name, root)  # after reading: a download is included
    return dataset


def _check_known(name: str) -> None:
    is_imagefolder = name.startswith(IMAGEFOLDER_PREFIX) and len(name) > len(IMAGEFOLDER_PREFIX)
    if name in _SPECS or is_imagefolder:
        return
    raise ValueError(
        f"unknown dataset {name!r}; known: {', '.join(DATASETS)}, or {IMAGEFOLDER_PREFIX}<path>"
    )


def _reject_options(name: str, options: dict) -> None:
    if options:
        raise TypeError(f"{name} takes no options, got {sorted(options)} (only synthetic has)")


def _download_allowed(download: bool | None) -> bool:
    if download is not None:
        return bool(download)
    value = os.environ.get("FEDLIB_DOWNLOAD", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"FEDLIB_DOWNLOAD must be '0' or '1', got {value!r}")
    return value == "1"


# ----------------------------------------------------------------------------- normalization


def _to_dataset(name: str, arrays: _ImageArrays, device) -> Dataset:
    _check_arrays(arrays)
    return _normalized_dataset(name, _to_unit_float(arrays.x_train), torch.as_tensor(arrays.y_train),
                               _to_unit_float(arrays.x_test), torch.as_tensor(arrays.y_test), arrays.classes,
                               arrays.source, device)


def _normalized_dataset(name, x_train, y_train, x_test, y_test, classes, source, device, fingerprint=None) -> Dataset:
    """The Dataset of float images [N, C, H, W], standardized (in place) with the training statistics."""
    mean, std = _normalize(x_train, x_test)
    return Dataset(name, x_train.to(device), y_train.to(device), x_test.to(device), y_test.to(device), list(classes),
                   source, channel_mean=mean, channel_std=std, fingerprint=fingerprint)


def _to_unit_float(images: np.ndarray) -> torch.Tensor:
    """uint8 [N, H, W, C] -> float32 [N, C, H, W] in [0, 1]."""
    nchw = torch.from_numpy(images).permute(0, 3, 1, 2)
    return nchw.to(torch.float32, memory_format=torch.contiguous_format).div_(255)


def _normalize(x_train: torch.Tensor, x_test: torch.Tensor) -> tuple[tuple, tuple]:
    """Standardize both sets in place per channel with the training statistics; return them."""
    std, mean = torch.std_mean(x_train, dim=(0, 2, 3), correction=0, keepdim=True)
    std = std.clamp_min(1e-12)  # a constant channel becomes 0, not NaN
    for x in (x_train, x_test):
        x.sub_(mean).div_(std)
    return tuple(mean.flatten().tolist()), tuple(std.flatten().tolist())


# ----------------------------------------------------------------------------- synthetic


def _make_synthetic(options: SyntheticOptions, device) -> Dataset:
    generator = torch.Generator().manual_seed(options.seed)
    shape = tuple(options.image_shape)
    prototypes = torch.randn((options.num_classes, *shape), generator=generator)

    def sample(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randperm(count, generator=generator) % options.num_classes
        noise = torch.randn((count, *shape), generator=generator)
        return prototypes[labels] + options.noise * noise, labels

    x_train, y_train = sample(options.n_train)
    x_test, y_test = sample(options.n_test)
    fingerprint = _synthetic_fingerprint(options)
    return _normalized_dataset("synthetic", x_train, y_train, x_test, y_test,
                               [f"class_{index}" for index in range(options.num_classes)], fingerprint["source"],
                               device, fingerprint)


# ----------------------------------------------------------------------------- errors


# ----------------------------------------------------------------------------- fingerprints

SYNTHETIC_GENERATOR = "1"  # bump when _make_synthetic changes the tensors it makes


@_access_errors_in_one_line
def data_fingerprint(name: str, root: str | os.PathLike | None = None) -> dict:
    """What loading ``name`` reads, without decoding it: ``{"source", "files": [[name, size], ...],
    "sha256"}``; ``sha256`` hashes the file names (relative to the source), sizes and contents, so
    the same files under another root give the same value. Content hashes are computed once per
    source and kept under ``$FEDLIB_CACHE/fingerprints`` (keyed by path, size and mtime).
    Files not found (yet): ``{"source": None, "missing": [paths looked at], "sha256": None}``."""
    if name == "synthetic":
        return _synthetic_fingerprint(SyntheticOptions())
    _check_known(name)
    if name.startswith(IMAGEFOLDER_PREFIX):
        path = Path(name[len(IMAGEFOLDER_PREFIX):]).expanduser().absolute()
        _check_data_path(path, name)
        located = (path, f"image folder {path}") if path.exists() else None
        looked = [path]
    else:
        data_root = Path(root).expanduser().absolute() if root is not None else default_data_root()
        located, looked = _locate(name, data_root)
    if located is None:
        return {"source": None, "missing": [str(p) for p in looked], "sha256": None}
    base, source, *only = located
    return {"source": source, **_content_fingerprint(base, *only)}


def _synthetic_fingerprint(options: SyntheticOptions) -> dict:
    text = json.dumps([SYNTHETIC_GENERATOR, repr(options)])
    return {"source": f"synthetic (seed={options.seed}, noise={options.noise})", "files": [],
            "sha256": hashlib.sha256(text.encode()).hexdigest()}


def _locate(name: str, root: Path) -> tuple[tuple[Path, str] | None, list[Path]]:
    """((file or folder the reader takes, its ``source`` text) or None, paths looked at); the
    same order of places as the readers."""
    if name in _IDX_FOLDERS:
        files, looked = _idx_files(name, root)
        if files is None:
            return None, looked
        folder = files["x_train"].parent
        return (folder, f"{name} idx files ({folder.name})", sorted(p.name for p in files.values())), looked
    looked = _torchvision_paths(name, root)
    if name == "cifar10":
        jpeg_copy = root / CIFAR10_JPEG
        if not looked[0].exists() and jpeg_copy.is_file():
            return (jpeg_copy, f"CIFAR-10 (JPEG copy, {jpeg_copy.name})"), [*looked, jpeg_copy]
        looked = [*looked, jpeg_copy]
    if name == "svhn":
        ok = all(p.is_file() for p in looked)
        return ((root, "svhn (torchvision files)") if ok else None), looked
    texts = {"cifar10": "cifar10 (torchvision files, {})", "cifar100": "cifar100 (torchvision files, {})",
             "emnist": "emnist balanced (torchvision files, {})", "eurosat": "eurosat ({})"}
    return ((looked[0], texts[name].format(looked[0].name)) if looked[0].exists() else None), looked


def tensor_fingerprint(dataset: Dataset) -> dict:
    """The fingerprint of a Dataset built in memory (no files): a hash of its tensors and classes."""
    digest = hashlib.sha256()
    for t in (dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test):
        t = t.detach().cpu().contiguous()
        digest.update(str((t.dtype, tuple(t.shape))).encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    digest.update(json.dumps(list(dataset.classes)).encode())
    return {"source": f"in-memory dataset ({dataset.source})", "files": [], "sha256": digest.hexdigest()}


_READERS = {
    "fmnist": partial(_read_idx_dataset, "fmnist"),
    "mnist": partial(_read_idx_dataset, "mnist"),
    "cifar10": _read_cifar10,
    "cifar100": _read_cifar100,
    "svhn": _read_svhn,
    "emnist": _read_emnist,
    "eurosat": _read_eurosat,
}
