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
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import math
import os
import re
import stat
import tarfile
import tempfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator

import numpy as np
import torch
from PIL import Image

from .cache import atomic_write_text, default_cache_root, read_regular
from .errors import SHOWN_CHARS, clipped

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
CIFAR10_JPEG = Path("cifar10-jpeg") / "cifar10-jpeg.tar.gz"
IMAGEFOLDER_PREFIX = "imagefolder:"
DATASETS = ("fmnist", "mnist", "cifar10", "cifar100", "svhn", "emnist", "eurosat", "synthetic")

EUROSAT_TEST_FRACTION = 0.2
EUROSAT_SPLIT_SEED = 0

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
DIGITS = tuple(str(digit) for digit in range(10))

_SPECS = {
    "fmnist": ((1, 28, 28), 10),
    "mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
    "svhn": ((3, 32, 32), 10),
    "emnist": ((1, 28, 28), 47),
    "eurosat": ((3, 64, 64), 10),
}

# name: (torchvision class, where that class keeps its files under root)
_TORCHVISION = {
    "fmnist": ("FashionMNIST", ("FashionMNIST/raw",)),
    "mnist": ("MNIST", ("MNIST/raw",)),
    "cifar10": ("CIFAR10", ("cifar-10-batches-py",)),
    "cifar100": ("CIFAR100", ("cifar-100-python",)),
    "svhn": ("SVHN", ("train_32x32.mat", "test_32x32.mat")),
    "emnist": ("EMNIST", ("EMNIST/raw",)),
    "eurosat": ("EuroSAT", ("eurosat/2750",)),
}

_IDX_FOLDERS = {"fmnist": "fashion-mnist", "mnist": "mnist"}
_IDX_CLASSES = {"fmnist": FASHION_MNIST_CLASSES, "mnist": DIGITS}
_IDX_STEMS = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

_SPLITS = ("train", "test")
_IMAGE_SUFFIXES = {
    ".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp",
}
_CACHE_FORMAT = 2  # 2: the npz records its source's content fingerprint and its arrays' hash
_ARRAY_FIELDS = ("x_train", "y_train", "x_test", "y_test")


def _one_line(text: str) -> str:
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip()


class DataNotFoundError(FileNotFoundError):
    """A dataset's files are in none of the places looked at and could not be downloaded."""

    def __init__(self, message: str):
        super().__init__(_one_line(message))


class DataAccessError(DataNotFoundError):
    """A data path that is not opened (a FIFO, a device, anything under /dev) or cannot be read
    (permission); the message is one line naming the path."""


def path_problem(path, *, directory: bool = False) -> str | None:
    """Why ``path`` cannot be data, in words (None: it can be, or it does not exist yet): a NUL byte,
    anything under /dev (``/dev/zero`` reads forever), a loop of symbolic links, a FIFO (blocks), a
    device or socket, a path that cannot be read; with ``directory``, anything but a directory.
    Checked before anything is opened; the one statement of these rules (configs use it too)."""
    try:
        text = os.fspath(path)
    except TypeError:
        return f"is not a path ({type(path).__name__})"
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\x00" in text:
        return "contains a NUL byte"
    real = os.path.realpath(text)
    if real == "/dev" or real.startswith("/dev/"):
        return "is under /dev (a device, not data)"
    try:
        mode = os.stat(text).st_mode
    except FileNotFoundError:
        return None  # the caller says what is missing (or a download makes it)
    except PermissionError:
        return "permission denied"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a loop of symbolic links"
        return f"cannot be read ({err.strerror or type(err).__name__})"
    except ValueError as err:
        return f"cannot be read ({_one_line(err)})"
    if stat.S_ISDIR(mode) or (stat.S_ISREG(mode) and not directory):
        return None
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
        "a socket" if stat.S_ISSOCK(mode) else "a file" if stat.S_ISREG(mode) else "not a regular file"
    return f"is {kind}, not a directory" if directory else f"is {kind}, not a regular file or directory"


def _check_data_path(path: Path, label: str, directory: bool = False) -> None:
    """Only regular files and directories are data (see :func:`path_problem`); anything else is a
    one-line DataAccessError naming the path, before it is opened."""
    problem = path_problem(path, directory=directory)
    if problem is not None:
        raise DataAccessError(f"{clipped(label)}: {clipped(path, 2 * SHOWN_CHARS)} {problem}; refused")


def _access_errors_in_one_line(function):
    """A PermissionError (or another OS error naming a file) while reading data becomes a one-line
    DataAccessError naming the path, not a traceback; so does a path that cannot be data (a NUL byte,
    a loop of symbolic links)."""
    import functools

    @functools.wraps(function)
    def wrapper(name, *args, **kwargs):
        root = kwargs.get("root", args[0] if args else None)
        if root is not None and isinstance(name, str) and name != "synthetic":
            _check_data_path(root, f"{name}: data root", directory=True)
        try:
            return function(name, *args, **kwargs)
        except DataNotFoundError:
            raise
        except PermissionError as err:
            raise DataAccessError(f"{clipped(name)}: {clipped(err.filename or 'a data file', 2 * SHOWN_CHARS)}: "
                                  "permission denied") from None
        except IsADirectoryError as err:
            raise DataAccessError(f"{clipped(name)}: {clipped(err.filename, 2 * SHOWN_CHARS)}: a directory where a "
                                  "file was expected") from None
        except OSError as err:  # a loop of symbolic links, an I/O error, a name too long
            where = clipped(err.filename, 2 * SHOWN_CHARS) if err.filename else "a data file"
            raise DataAccessError(f"{clipped(name)}: {where}: cannot be read "
                                  f"({err.strerror or type(err).__name__})") from None

    return wrapper


class DataCorruptError(ValueError):
    """A data file exists but cannot be decoded (truncated, bad header, wrong length)."""

    def __init__(self, message: str):
        super().__init__(_one_line(message))


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


@dataclass
class _ImageArrays:
    """Decoded data before normalization: uint8 images [N, H, W, C], int64 labels [N]."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str]
    source: str


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
            places.append(DEBIAN_FASHION_MNIST)
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


def _check_arrays(arrays: _ImageArrays) -> None:
    """Raise DataCorruptError unless images and labels have the expected types and sizes."""
    for x, y in ((arrays.x_train, arrays.y_train), (arrays.x_test, arrays.y_test)):
        consistent = (
            x.dtype == np.uint8 and x.ndim == 4 and y.dtype == np.int64 and y.shape == (len(x),)
            and x.shape[1:] == arrays.x_train.shape[1:]
            and (y.size == 0 or (y.min() >= 0 and y.max() < len(arrays.classes)))
        )
        if not consistent:
            raise DataCorruptError(
                f"inconsistent images/labels read from {arrays.source}: images {x.dtype} "
                f"{x.shape}, labels {y.dtype} {y.shape}, {len(arrays.classes)} classes"
            )
    for split, y in (("train", arrays.y_train), ("test", arrays.y_test)):
        counts = np.bincount(y, minlength=len(arrays.classes))
        if len(y) == 0 or not counts.all():
            missing = [arrays.classes[c] for c in np.flatnonzero(counts == 0)][:5]
            raise DataCorruptError(
                f"incomplete data read from {arrays.source}: the {split} split has {len(y)} images and "
                f"no image of class(es) {missing} (truncated or partial copy?)"
            )


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


def _not_found(name: str, looked: Iterable[Path], download: bool, error: Exception | None = None):
    """The one-line DataNotFoundError: what was looked at, why nothing came, how to fix it."""
    if download:
        status = "download failed"
        if error:
            status += f" ({type(error).__name__}: {error})"
    else:
        status = "download disabled (download=False or FEDLIB_DOWNLOAD=0)"
        if error:
            status += f"; torchvision: {error}"
    advice = "Provide them: put the files in one of those places (root=... or FEDLIB_DATA)"
    if name == "fmnist":
        advice += ", or apt-get install dataset-fashion-mnist"
    if not download:
        advice += ", or allow downloading (download=True or FEDLIB_DOWNLOAD=1)"
    paths = ", ".join(str(path) for path in looked)
    return DataNotFoundError(
        f"{name}: data files not found; looked in {paths}; {status}. {advice}."
    )


# ----------------------------------------------------------------------------- torchvision


def _torchvision_paths(name: str, root: Path) -> list[Path]:
    return [root / relative for relative in _TORCHVISION[name][1]]


def _open_torchvision(name: str, root: Path, looked: list[Path], download: bool, **options):
    """A torchvision dataset object; any failure becomes a one-line DataNotFoundError."""
    try:
        import torchvision.datasets

        dataset_class = getattr(torchvision.datasets, _TORCHVISION[name][0])
        return dataset_class(str(root), download=download, **options)
    except Exception as error:  # torchvision and its downloads raise many kinds
        raise _not_found(name, looked, download, error) from None


def _read_cifar(name: str, root: Path, looked: list[Path], download: bool) -> _ImageArrays:
    train = _open_torchvision(name, root, looked, download, train=True)
    test = _open_torchvision(name, root, looked, download, train=False)
    return _ImageArrays(
        x_train=train.data,
        y_train=np.asarray(train.targets, dtype=np.int64),
        x_test=test.data,
        y_test=np.asarray(test.targets, dtype=np.int64),
        classes=list(train.classes),
        source=f"{name} (torchvision files, {looked[0].name})",
    )


def _read_cifar10(root: Path, download: bool, cache_dir) -> _ImageArrays:
    torchvision_folder, jpeg_copy = _torchvision_paths("cifar10", root)[0], root / CIFAR10_JPEG
    if torchvision_folder.exists() or not jpeg_copy.is_file():
        return _read_cifar("cifar10", root, [torchvision_folder, jpeg_copy], download)
    source = f"CIFAR-10 (JPEG copy, {jpeg_copy.name})"
    arrays = _load_image_tree(jpeg_copy, "cifar10-jpeg", source, cache_dir)
    if arrays.classes != list(CIFAR10_CLASSES):
        raise DataCorruptError(f"{jpeg_copy}: class folders {arrays.classes} are not CIFAR-10's")
    return arrays


def _read_cifar100(root: Path, download: bool, cache_dir) -> _ImageArrays:
    return _read_cifar("cifar100", root, _torchvision_paths("cifar100", root), download)


def _read_svhn(root: Path, download: bool, cache_dir) -> _ImageArrays:
    looked = _torchvision_paths("svhn", root)
    train = _open_torchvision("svhn", root, looked, download, split="train")
    test = _open_torchvision("svhn", root, looked, download, split="test")
    return _ImageArrays(
        x_train=train.data.transpose(0, 2, 3, 1),  # torchvision keeps SVHN as [N, C, H, W]
        y_train=train.labels.astype(np.int64),
        x_test=test.data.transpose(0, 2, 3, 1),
        y_test=test.labels.astype(np.int64),
        classes=list(DIGITS),
        source="svhn (torchvision files)",
    )


def _read_emnist(root: Path, download: bool, cache_dir) -> _ImageArrays:
    looked = _torchvision_paths("emnist", root)
    train = _open_torchvision("emnist", root, looked, download, split="balanced", train=True)
    test = _open_torchvision("emnist", root, looked, download, split="balanced", train=False)

    def upright(images: torch.Tensor) -> np.ndarray:
        """EMNIST's files store images transposed; swap H and W so characters stand upright."""
        return images.numpy().transpose(0, 2, 1)[..., None]

    return _ImageArrays(
        x_train=upright(train.data),
        y_train=train.targets.numpy().astype(np.int64),
        x_test=upright(test.data),
        y_test=test.targets.numpy().astype(np.int64),
        classes=list(train.classes),
        source=f"emnist balanced (torchvision files, {looked[0].name})",
    )


def _read_eurosat(root: Path, download: bool, cache_dir) -> _ImageArrays:
    looked = _torchvision_paths("eurosat", root)
    dataset = _open_torchvision("eurosat", root, looked, download)
    split = [EUROSAT_TEST_FRACTION, EUROSAT_SPLIT_SEED]
    cache_file = _cache_file(cache_dir, "eurosat", looked[0], split)
    source_sha256 = _content_fingerprint(looked[0])["sha256"]
    return _cached(cache_file, lambda: _split_eurosat(dataset, looked[0]), source_sha256)


def _split_eurosat(dataset, folder: Path) -> _ImageArrays:
    """Decode all EuroSAT images and split them 80/20 per class with a fixed seed."""
    images = _decode_images((path, Path(path).read_bytes()) for path, _ in dataset.samples)
    labels = np.array([label for _, label in dataset.samples], dtype=np.int64)
    test = _stratified_test_mask(labels, EUROSAT_TEST_FRACTION, EUROSAT_SPLIT_SEED)
    return _ImageArrays(
        x_train=images[~test],
        y_train=labels[~test],
        x_test=images[test],
        y_test=labels[test],
        classes=list(dataset.classes),
        source=f"eurosat ({folder.name}, stratified split, {EUROSAT_TEST_FRACTION:.0%} test, "
        f"seed {EUROSAT_SPLIT_SEED})",
    )


def _stratified_test_mask(labels: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask choosing round(test_fraction * n_c) random samples of each class c."""
    rng = np.random.default_rng(seed)
    test = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        test[members[: round(test_fraction * len(members))]] = True
    return test


# ----------------------------------------------------------------------------- idx files


def _read_idx_dataset(name: str, root: Path, download: bool, cache_dir) -> _ImageArrays:
    """MNIST-style idx files from the first folder that has all four, downloading if allowed."""
    files, looked = _idx_files(name, root)
    if files is None and download:
        _open_torchvision(name, root, looked, download=True)  # downloads into torchvision's raw folder
        files = _find_idx_files(looked[-1])
    if files is None:
        raise _not_found(name, looked, download)
    arrays = {key: _read_idx(path, ndim=3 if key[0] == "x" else 1) for key, path in files.items()}
    return _ImageArrays(
        x_train=arrays["x_train"][..., None],
        y_train=arrays["y_train"].astype(np.int64),
        x_test=arrays["x_test"][..., None],
        y_test=arrays["y_test"].astype(np.int64),
        classes=list(_IDX_CLASSES[name]),
        source=f"{name} idx files ({files['x_train'].parent.name})",
    )


def _idx_files(name: str, root: Path) -> tuple[dict[str, Path] | None, list[Path]]:
    """The four idx files of the first folder that has them all (None if none has), and the folders looked at."""
    looked = [*([DEBIAN_FASHION_MNIST] if name == "fmnist" else []), root / _IDX_FOLDERS[name],
              _torchvision_paths(name, root)[0]]
    return next(filter(None, map(_find_idx_files, looked)), None), looked


def _find_idx_files(folder: Path) -> dict[str, Path] | None:
    """The four idx files (gzipped or not) in ``folder``, or None if any is missing."""
    found = {}
    for key, stem in _IDX_STEMS.items():
        path = next((p for p in (folder / f"{stem}.gz", folder / stem) if p.is_file()), None)
        if path is None:
            return None
        found[key] = path
    return found


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """An idx file of unsigned bytes with ``ndim`` dimensions as a (writable) uint8 array."""
    content = path.read_bytes()
    if path.suffix == ".gz":
        try:
            content = gzip.decompress(content)
        except (OSError, EOFError, zlib.error) as error:
            raise DataCorruptError(f"corrupt gzip file {path}: {error}") from None
    header_size = 4 + 4 * ndim
    if len(content) < header_size or content[:4] != bytes([0, 0, 0x08, ndim]):
        raise DataCorruptError(f"{path}: bad magic number for a {ndim}-d idx file of bytes")
    shape = tuple(int.from_bytes(content[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header_size + math.prod(shape)
    if len(content) != expected:
        raise DataCorruptError(f"{path}: {len(content)} bytes, header {shape} needs {expected}")
    return np.frombuffer(content, dtype=np.uint8, offset=header_size).reshape(shape).copy()


# ----------------------------------------------------------------------------- image trees


def _read_imagefolder(path_text: str, cache_dir) -> _ImageArrays:
    label = IMAGEFOLDER_PREFIX + path_text
    path = Path(path_text).expanduser().absolute()
    _check_data_path(path, label)
    if not path.exists():
        raise DataNotFoundError(
            f"{label}: data files not found; looked in {path}. Provide a directory or .tar.gz "
            "with train/<class>/<image> and test/<class>/<image> files"
        )
    return _load_image_tree(path, label, f"image folder {path}", cache_dir)


def _load_image_tree(path: Path, label: str, source: str, cache_dir) -> _ImageArrays:
    cache_file = _cache_file(cache_dir, label, path)
    source_sha256 = _content_fingerprint(path)["sha256"]
    return _cached(cache_file, lambda: _read_image_tree(path, label, source), source_sha256)


def _read_image_tree(path: Path, label: str, source: str) -> _ImageArrays:
    """Decode train/<class>/* and test/<class>/* of a directory or archive, in sorted order."""
    samples = []  # (split, class, file name, content)
    for relative, content in _tree_files(path):
        split_and_class = _split_and_class(relative)
        if split_and_class:
            samples.append((*split_and_class, relative, content))
    samples.sort(key=lambda sample: sample[:3])
    classes = sorted({cls for split, cls, *_ in samples if split == "train"})
    test_classes = {cls for split, cls, *_ in samples if split == "test"}
    if not classes or not test_classes:
        raise DataNotFoundError(
            f"{label}: no images under train/<class>/ and test/<class>/ in {path} (both are needed)"
        )
    if not test_classes <= set(classes):
        unknown = sorted(test_classes - set(classes))
        raise DataCorruptError(f"{path}: test classes {unknown} have no training images")
    images = _decode_images((f"{path}/{relative}", content) for _, _, relative, content in samples)
    class_index = {cls: index for index, cls in enumerate(classes)}
    labels = np.array([class_index[cls] for _, cls, *_ in samples], dtype=np.int64)
    train = np.array([split == "train" for split, *_ in samples])
    return _ImageArrays(
        images[train], labels[train], images[~train], labels[~train], classes, source
    )


def _tree_files(path: Path) -> Iterator[tuple[str, bytes]]:
    """(relative POSIX path, content) of each image file in a directory or tar archive."""
    if path.is_dir():
        for file in sorted(path.rglob("*")):
            relative = file.relative_to(path).as_posix()
            if _is_image_name(relative) and file.is_file():
                yield relative, file.read_bytes()
        return
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                if member.isfile() and _is_image_name(member.name):
                    yield member.name, archive.extractfile(member).read()
            _check_archive_end(archive, path)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise DataCorruptError(f"cannot read archive {path}: {error}") from None


def _check_archive_end(archive: tarfile.TarFile, path: Path) -> None:
    """A complete tar ends with a zero block after its last member (a cut at a member boundary
    does not); reading a compressed stream to its end checks its CRC (gzip) or checksum."""
    archive.fileobj.seek(archive.offset)
    if archive.fileobj.read(tarfile.BLOCKSIZE) != bytes(tarfile.BLOCKSIZE):
        raise DataCorruptError(f"truncated archive {path}: no end-of-archive block after its last member")
    while archive.fileobj.read(1 << 20):
        pass


def _is_image_name(relative: str) -> bool:
    path = PurePosixPath(relative)
    hidden = any(part.startswith(".") for part in path.parts)
    return not hidden and path.suffix.lower() in _IMAGE_SUFFIXES


def _split_and_class(relative: str) -> tuple[str, str] | None:
    """("train" or "test", class) for split/class/.../file, optionally below one top folder."""
    parts = PurePosixPath(relative).parts
    if parts and parts[0] not in _SPLITS:
        parts = parts[1:]
    if len(parts) >= 3 and parts[0] in _SPLITS:
        return parts[0], parts[1]
    return None


def _decode_image(content: bytes, name: str) -> np.ndarray:
    """uint8 [H, W] for a grayscale ("L") image, else [H, W, 3] RGB."""
    try:
        with Image.open(io.BytesIO(content)) as image:
            return np.asarray(image if image.mode == "L" else image.convert("RGB"))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise DataCorruptError(f"cannot decode image {name}: {error}") from None


def _decode_images(named_contents: Iterable[tuple[str, bytes]]) -> np.ndarray:
    """uint8 [N, H, W, C]: one channel if every image is grayscale, else RGB; one size for all."""
    images, names = [], []
    for name, content in named_contents:
        images.append(_decode_image(content, name))
        names.append(name)
    size = images[0].shape[:2]
    for image, name in zip(images, names):
        if image.shape[:2] != size:
            raise DataCorruptError(
                f"image {name} is {image.shape[0]}x{image.shape[1]} (HxW) but {names[0]} is "
                f"{size[0]}x{size[1]}: all images must have one size"
            )
    if all(image.ndim == 2 for image in images):
        return np.stack(images)[..., None]
    return np.stack([_gray_to_rgb(image) if image.ndim == 2 else image for image in images])


def _gray_to_rgb(image: np.ndarray) -> np.ndarray:
    return np.repeat(image[..., None], 3, axis=2)


# ----------------------------------------------------------------------------- cache


def _cache_file(cache_dir, label: str, source: Path, extra: list | None = None) -> Path:
    """The cache path for ``source``: its name hashes the path, file sizes and mtimes."""
    root = cache_dir or default_cache_root() / "datasets"
    key = json.dumps([_CACHE_FORMAT, str(source.resolve()), _fingerprint(source), extra])
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")[-60:]
    return Path(root).expanduser() / f"{readable}-{digest}.npz"


def _fingerprint(source: Path) -> list:
    """Size and mtime of a file, or of every file below a directory."""
    if not source.is_dir():
        stat = source.stat()
        return [stat.st_size, stat.st_mtime_ns]
    entries = []
    for file in sorted(source.rglob("*")):
        if file.is_file():
            stat = file.stat()
            entries.append([file.relative_to(source).as_posix(), stat.st_size, stat.st_mtime_ns])
    return entries


def _cached(cache_file: Path, build: Callable[[], _ImageArrays], source_sha256: str) -> _ImageArrays:
    """Arrays from ``cache_file`` if it records ``source_sha256`` (the content fingerprint of the
    files it was decoded from) and its arrays still hash to the value it records; otherwise
    (missing, unreadable, another source, altered arrays) build them and write it anew."""
    if os.path.lexists(cache_file) and not (cache_file.is_file() and not cache_file.is_symlink()):
        warnings.warn(f"rebuilding dataset cache {cache_file}: not a regular file")
    elif cache_file.exists():
        try:
            return _read_cache(cache_file, source_sha256)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
            warnings.warn(f"rebuilding dataset cache {cache_file}: {_one_line(error)}")
    arrays = build()
    _write_cache(cache_file, arrays, source_sha256)
    return arrays


def _arrays_sha256(arrays: _ImageArrays) -> str:
    digest = hashlib.sha256()
    for key in _ARRAY_FIELDS:
        value = np.ascontiguousarray(getattr(arrays, key))
        digest.update(f"{key}{value.dtype}{value.shape}".encode())
        digest.update(value.tobytes())
    digest.update(json.dumps([list(arrays.classes), arrays.source]).encode())
    return digest.hexdigest()


def _read_cache(cache_file: Path, source_sha256: str) -> _ImageArrays:
    with np.load(cache_file, allow_pickle=False) as npz:
        arrays = _ImageArrays(
            **{key: npz[key] for key in _ARRAY_FIELDS},
            classes=npz["classes"].tolist(),
            source=str(npz["source"]),
        )
        recorded_source = str(npz["source_sha256"]) if "source_sha256" in npz else None
        recorded_arrays = str(npz["arrays_sha256"]) if "arrays_sha256" in npz else None
    if recorded_source != source_sha256:
        raise ValueError("it was decoded from other source files (or records no source fingerprint)")
    if recorded_arrays != _arrays_sha256(arrays):
        raise ValueError("its arrays do not match the hash it records")
    _check_arrays(arrays)
    return arrays


def _write_cache(cache_file: Path, arrays: _ImageArrays, source_sha256: str) -> None:
    """Write atomically (a temporary file in the same folder, then os.replace); warn on failure."""
    temporary = None
    try:
        folder = cache_file.parent
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".tmp", delete=False) as handle:
            temporary = Path(handle.name)
            np.savez(
                handle,
                **{key: getattr(arrays, key) for key in _ARRAY_FIELDS},
                classes=np.array(arrays.classes, dtype=str),
                source=np.array(arrays.source, dtype=str),
                source_sha256=np.array(source_sha256, dtype=str),
                arrays_sha256=np.array(_arrays_sha256(arrays), dtype=str),
            )
        os.chmod(temporary, 0o644)  # NamedTemporaryFile makes it private
        os.replace(temporary, cache_file)
    except OSError as error:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        warnings.warn(f"could not write dataset cache {cache_file}: {error}")


# ----------------------------------------------------------------------------- fingerprints

SYNTHETIC_GENERATOR = "1"  # bump when _make_synthetic changes the tensors it makes
_FINGERPRINT_MEMO: dict[str, dict] = {}


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


def _source_files(base: Path, only: list[str] | None = None) -> list[tuple[str, Path]]:
    if only is not None:
        return [(n, base / n) for n in only]
    if base.is_file():
        return [(base.name, base)]
    names = ("train_32x32.mat", "test_32x32.mat") if (base / "train_32x32.mat").is_file() else None
    if names:  # svhn: the two files at the root, not everything below it
        return [(n, base / n) for n in names]
    return [(f.relative_to(base).as_posix(), f) for f in sorted(base.rglob("*")) if f.is_file()]


def _content_fingerprint(base: Path, only: list[str] | None = None) -> dict:
    files = _source_files(base, only)
    stats = [(rel, f.stat()) for rel, f in files]
    stamp = json.dumps([str(base.resolve()), [[rel, st.st_size, st.st_mtime_ns] for rel, st in stats]])
    stamp_digest = hashlib.sha256(stamp.encode()).hexdigest()[:32]
    if stamp_digest in _FINGERPRINT_MEMO:
        return _FINGERPRINT_MEMO[stamp_digest]
    stored = default_cache_root() / "fingerprints" / f"{stamp_digest}.json"
    result = None
    try:
        candidate = json.loads(read_regular(stored, limit=1 << 20))
        if candidate.get("stamp") == stamp:
            result = candidate["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        result = None
    if result is None:
        rows = [[rel, st.st_size, _file_sha256(f)] for (rel, f), (_, st) in zip(files, stats)]
        digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
        result = {"files": [[rel, size] for rel, size, _ in rows], "sha256": digest}
        try:
            atomic_write_text(stored, json.dumps({"stamp": stamp, "fingerprint": result}))
        except OSError as error:
            warnings.warn(f"could not keep the data fingerprint in {stored}: {error}")
    if len(result["files"]) > 50:  # provenance stays small: the count, not every name
        result = {"files": [[f"{len(result['files'])} files", sum(s for _, s in result["files"])]],
                  "sha256": result["sha256"]}
    _FINGERPRINT_MEMO[stamp_digest] = result
    return result


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
