"""Where each dataset is read from: one reader per source, returning raw image arrays.

torchvision's files (CIFAR-10/100, SVHN, EMNIST, EuroSAT with its stratified split), idx files
(MNIST, Fashion-MNIST: the Debian package, ``<root>/<folder>``, torchvision's raw folder) and image
trees (``imagefolder:<path>``, the CIFAR-10 JPEG copy), decoded with PIL and cached as ``.npz``
(``fedlib.data_files``). ``fedlib.data.load_dataset`` picks the reader and normalizes the arrays.
"""

from __future__ import annotations

import gzip
import io
import math
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator

import numpy as np
import torch
from PIL import Image

from .data_files import (DataCorruptError, DataNotFoundError, _cache_file, _cached, _check_data_path,
                         _content_fingerprint, _ImageArrays, _not_found)


DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
CIFAR10_JPEG = Path("cifar10-jpeg") / "cifar10-jpeg.tar.gz"
IMAGEFOLDER_PREFIX = "imagefolder:"

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


# ----------------------------------------------------------------------------- torchvision


def _torchvision_paths(name: str, root: Path) -> list[Path]:
    return [root / relative for relative in _TORCHVISION[name][1]]


def _open_torchvision(name: str, root: Path, looked: list[Path], download: bool, **options):
    """A torchvision dataset object; any failure becomes a one-line DataNotFoundError."""
    try:
        import torchvision.datasets  # lazy: torchvision is heavy (~2 s), needed only for its files

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


