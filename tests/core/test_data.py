"""Tests of fedlib.data: real idx files, synthetic data, image folders, caching and errors."""

from __future__ import annotations

import gzip
import os
import tarfile
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets
from PIL import Image

from fedlib import data, data_sources
from fedlib.data import dataset_spec, load_dataset
from fedlib.data_files import DataCorruptError, DataNotFoundError

# the offline copies: the data root CI exports, else ../shared/datasets beside the checkout
SHARED_DATASETS = Path(os.environ.get("FEDLIB_DATA") or Path(__file__).resolve().parents[3] / "shared" / "datasets")
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch, tmp_path):
    """No downloads, no user data root, and a cache inside tmp_path."""
    monkeypatch.setenv("FEDLIB_DOWNLOAD", "0")
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDLIB_DATA", raising=False)


def pixel_values(x: torch.Tensor, dataset: data.Dataset) -> np.ndarray:
    """Undo the normalization: uint8-scale pixel values as [N, C, H, W] integers."""
    mean = torch.tensor(dataset.channel_mean).reshape(1, -1, 1, 1)
    std = torch.tensor(dataset.channel_std).reshape(1, -1, 1, 1)
    return ((x * std + mean) * 255).round().to(torch.int64).numpy()


def assert_standardized(dataset: data.Dataset) -> None:
    mean = dataset.x_train.mean(dim=(0, 2, 3))
    std = dataset.x_train.std(dim=(0, 2, 3), correction=0)
    assert torch.allclose(mean, torch.zeros_like(mean), atol=1e-4)
    assert torch.allclose(std, torch.ones_like(std), atol=1e-4)


def assert_one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and "\r" not in message
    return message


# ----------------------------------------------------------------------------- idx datasets


@pytest.fixture(scope="module")
def fmnist():
    if not (data_sources.DEBIAN_FASHION_MNIST / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("dataset-fashion-mnist is not installed")
    return load_dataset("fmnist", download=False)


def test_fmnist_sizes_classes_and_balance(fmnist):
    assert fmnist.x_train.shape == (60000, 1, 28, 28) and fmnist.x_test.shape == (10000, 1, 28, 28)
    assert fmnist.x_train.dtype == torch.float32 and fmnist.y_train.dtype == torch.int64
    assert fmnist.input_shape == (1, 28, 28) and fmnist.num_classes == 10
    assert fmnist.classes[0] == "T-shirt/top" and fmnist.classes[9] == "Ankle boot"
    assert fmnist.y_train.bincount().tolist() == [6000] * 10
    assert fmnist.y_test.bincount().tolist() == [1000] * 10
    assert fmnist.source == "fmnist idx files (fashion-mnist)"  # the dataset, not where it sat


def test_fmnist_is_standardized_with_training_statistics(fmnist):
    assert_standardized(fmnist)
    assert fmnist.channel_mean[0] == pytest.approx(0.2860, abs=1e-4)
    assert fmnist.channel_std[0] == pytest.approx(0.3530, abs=1e-4)
    assert abs(fmnist.x_test.mean().item()) < 0.02  # normalized with the training statistics


def test_mnist_from_shared_copy_has_known_class_counts():
    if not (SHARED_DATASETS / "mnist").is_dir():
        pytest.skip("no shared MNIST copy")
    mnist = load_dataset("mnist", root=SHARED_DATASETS, download=False)
    assert mnist.y_train.bincount().tolist() == MNIST_TRAIN_COUNTS
    assert len(mnist.y_test) == 10000 and mnist.input_shape == (1, 28, 28)
    assert_standardized(mnist)


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(n.to_bytes(4, "big") for n in array.shape)
    content = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(content) if path.suffix == ".gz" else content)


def write_tiny_mnist(folder: Path, suffix: str = ".gz") -> None:
    """A 20/10-image MNIST-format set whose pixel values equal 10 * label."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 20), ("t10k", 10)):
        labels = np.arange(count) % 10
        images = np.repeat(labels[:, None, None] * 10, 28 * 28).reshape(count, 28, 28)
        write_idx(folder / f"{split}-images-idx3-ubyte{suffix}", images)
        write_idx(folder / f"{split}-labels-idx1-ubyte{suffix}", labels)


@pytest.mark.parametrize("suffix", [".gz", ""])
def test_idx_files_gzipped_or_not(tmp_path, suffix):
    write_tiny_mnist(tmp_path / "mnist", suffix)
    mnist = load_dataset("mnist", root=tmp_path)
    assert len(mnist.y_train) == 20 and len(mnist.y_test) == 10
    assert (pixel_values(mnist.x_train, mnist)[:, 0, 0, 0] == mnist.y_train.numpy() * 10).all()


def test_idx_in_torchvision_layout(tmp_path):
    write_tiny_mnist(tmp_path / "MNIST" / "raw", suffix="")
    assert load_dataset("mnist", root=tmp_path).source == "mnist idx files (raw)"


def test_truncated_idx_gz_is_corrupt_and_named(tmp_path):
    write_tiny_mnist(tmp_path / "mnist")
    images = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[: images.stat().st_size // 2])
    with pytest.raises(DataCorruptError) as error:
        load_dataset("mnist", root=tmp_path)
    assert str(images) in assert_one_line(error)


@pytest.mark.parametrize("damage", ["magic", "length"])
def test_bad_idx_header_or_length_is_corrupt(tmp_path, damage):
    write_tiny_mnist(tmp_path / "mnist", suffix="")
    labels = tmp_path / "mnist" / "t10k-labels-idx1-ubyte"
    content = labels.read_bytes()
    damaged = b"\x00\x00\x09\x01" + content[4:] if damage == "magic" else content + b"\x00"
    labels.write_bytes(damaged)
    with pytest.raises(DataCorruptError) as error:
        load_dataset("mnist", root=tmp_path)
    assert str(labels) in assert_one_line(error)


# ----------------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_per_seed():
    first, again = load_dataset("synthetic", seed=3), load_dataset("synthetic", seed=3)
    other = load_dataset("synthetic", seed=4)
    for key in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(first, key), getattr(again, key))
    assert not torch.equal(first.x_train, other.x_train)


def test_synthetic_options_shapes_and_balance():
    options = dict(num_classes=4, image_shape=(3, 8, 6), n_train=100, n_test=40)
    synthetic = load_dataset("synthetic", **options)
    assert synthetic.x_train.shape == (100, 3, 8, 6) and synthetic.x_test.shape == (40, 3, 8, 6)
    assert synthetic.num_classes == 4 and synthetic.y_train.bincount().tolist() == [25] * 4
    assert_standardized(synthetic)
    assert dataset_spec("synthetic", num_classes=4, image_shape=(3, 8, 6)) == ((3, 8, 6), 4)


def test_synthetic_is_learnable_by_linear_models():
    synthetic = load_dataset("synthetic")
    x_train, x_test = synthetic.x_train.flatten(1), synthetic.x_test.flatten(1)
    class_means = torch.stack([x_train[synthetic.y_train == c].mean(0) for c in range(10)])
    nearest_mean = torch.cdist(x_test, class_means).argmin(1)
    assert (nearest_mean == synthetic.y_test).float().mean() > 0.8

    weights = torch.zeros(x_train.shape[1], 10, requires_grad=True)
    optimizer = torch.optim.SGD([weights], lr=0.1)
    for _ in range(10):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(x_train @ weights, synthetic.y_train).backward()
        optimizer.step()
    accuracy = ((x_test @ weights).argmax(1) == synthetic.y_test).float().mean()
    assert accuracy > 0.8


# ----------------------------------------------------------------------------- image folders

CLASSES = ("ant", "bee", "cat")


def write_image_tree(folder: Path, mode: str = "L", counts: dict[str, int] | None = None) -> None:
    """train/<class>/<i>.png and test/<class>/<i>.png, 5x4 pixels of value 50*class + i."""
    for split, count in (counts or {"train": 3, "test": 2}).items():
        for label, name in enumerate(CLASSES):
            (folder / split / name).mkdir(parents=True, exist_ok=True)
            for index in range(count):
                image = Image.new("L", (5, 4), 50 * label + index)
                image.convert(mode).save(folder / split / name / f"{index}.png")
    (folder / "README.txt").write_text("not an image")


def write_archive(tree: Path, archive: Path, top_folder: str | None) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=top_folder or ".")
    return archive


def assert_tree_contents(dataset: data.Dataset, channels: int = 1) -> None:
    assert dataset.classes == list(CLASSES)
    assert dataset.x_train.shape == (9, channels, 4, 5)
    assert dataset.x_test.shape == (6, channels, 4, 5)
    assert dataset.y_train.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert dataset.y_test.tolist() == [0, 0, 1, 1, 2, 2]
    expected_train = [50 * label + index for label in range(3) for index in range(3)]
    corner_pixels = pixel_values(dataset.x_train, dataset)[:, :, 0, 0]
    assert corner_pixels.tolist() == [[value] * channels for value in expected_train]
    assert_standardized(dataset)


def test_imagefolder_from_directory(tmp_path):
    write_image_tree(tmp_path / "tree")
    dataset = load_dataset(f"imagefolder:{tmp_path / 'tree'}")
    assert_tree_contents(dataset)
    assert dataset.name == f"imagefolder:{tmp_path / 'tree'}"


@pytest.mark.parametrize("top_folder", [None, "pets"])
def test_imagefolder_from_tar_gz(tmp_path, top_folder):
    write_image_tree(tmp_path / "tree")
    archive = write_archive(tmp_path / "tree", tmp_path / "pets.tar.gz", top_folder)
    assert_tree_contents(load_dataset(f"imagefolder:{archive}"))


def test_imagefolder_rgb_unless_all_grayscale(tmp_path):
    write_image_tree(tmp_path / "rgb", mode="RGB")
    assert_tree_contents(load_dataset(f"imagefolder:{tmp_path / 'rgb'}"), channels=3)
    write_image_tree(tmp_path / "mixed")
    Image.new("RGB", (5, 4), (7, 7, 7)).save(tmp_path / "mixed" / "test" / "ant" / "9.png")
    assert load_dataset(f"imagefolder:{tmp_path / 'mixed'}").input_shape == (3, 4, 5)


def test_imagefolder_second_load_uses_cache(tmp_path, monkeypatch):
    write_image_tree(tmp_path / "tree")
    cache = tmp_path / "my-cache"
    first = load_dataset(f"imagefolder:{tmp_path / 'tree'}", cache_dir=cache)
    assert len(list(cache.glob("*.npz"))) == 1 and not list(cache.glob("*.tmp"))

    def no_decoding(*args):
        raise AssertionError("decoded although cached")

    monkeypatch.setattr(data_sources, "_decode_image", no_decoding)
    second = load_dataset(f"imagefolder:{tmp_path / 'tree'}", cache_dir=cache)
    assert torch.equal(first.x_train, second.x_train) and second.classes == first.classes


def test_cache_changes_with_source(tmp_path):
    write_image_tree(tmp_path / "tree")
    load_dataset(f"imagefolder:{tmp_path / 'tree'}")
    Image.new("L", (5, 4), 200).save(tmp_path / "tree" / "train" / "bee" / "extra.png")
    assert len(load_dataset(f"imagefolder:{tmp_path / 'tree'}").y_train) == 10
    assert len(list((tmp_path / "cache" / "datasets").glob("*.npz"))) == 2


def test_unreadable_cache_is_rebuilt(tmp_path):
    write_image_tree(tmp_path / "tree")
    load_dataset(f"imagefolder:{tmp_path / 'tree'}")
    (cache_file,) = (tmp_path / "cache" / "datasets").glob("*.npz")
    cache_file.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="rebuilding"):
        assert_tree_contents(load_dataset(f"imagefolder:{tmp_path / 'tree'}"))
    assert cache_file.stat().st_size > 100


def test_cache_holds_no_pickles(tmp_path):
    write_image_tree(tmp_path / "tree")
    load_dataset(f"imagefolder:{tmp_path / 'tree'}")
    (cache_file,) = (tmp_path / "cache" / "datasets").glob("*.npz")
    with np.load(cache_file, allow_pickle=False) as npz:
        assert npz["x_train"].dtype == np.uint8 and npz["x_train"].shape == (9, 4, 5, 1)
        assert npz["y_train"].dtype == np.int64 and npz["classes"].tolist() == list(CLASSES)


def test_imagefolder_corrupt_image_is_named(tmp_path):
    write_image_tree(tmp_path / "tree")
    broken = tmp_path / "tree" / "train" / "bee" / "1.png"
    broken.write_bytes(broken.read_bytes()[:20])
    with pytest.raises(DataCorruptError) as error:
        load_dataset(f"imagefolder:{tmp_path / 'tree'}")
    assert "bee/1.png" in assert_one_line(error)


def test_imagefolder_missing_or_empty(tmp_path):
    with pytest.raises(DataNotFoundError) as error:
        load_dataset(f"imagefolder:{tmp_path / 'absent'}")
    assert str(tmp_path / "absent") in assert_one_line(error)
    write_image_tree(tmp_path / "train-only", counts={"train": 1})
    with pytest.raises(DataNotFoundError, match="test/<class>"):
        load_dataset(f"imagefolder:{tmp_path / 'train-only'}")


def test_cifar10_falls_back_to_jpeg_copy(tmp_path):
    tree = tmp_path / "tree"
    for split in ("train", "test"):
        for label, name in enumerate(data_sources.CIFAR10_CLASSES):
            (tree / split / name).mkdir(parents=True)
            Image.new("RGB", (32, 32), (label * 20, 0, 0)).save(tree / split / name / "0000.jpg")
    (tmp_path / "root" / "cifar10-jpeg").mkdir(parents=True)
    archive = write_archive(tree, tmp_path / "root" / data_sources.CIFAR10_JPEG, top_folder=None)
    cifar = load_dataset("cifar10", root=tmp_path / "root")
    assert cifar.source == f"CIFAR-10 (JPEG copy, {archive.name})"
    assert cifar.input_shape == (3, 32, 32) and cifar.classes == list(data_sources.CIFAR10_CLASSES)
    assert cifar.y_train.tolist() == list(range(10))
    red = pixel_values(cifar.x_train, cifar)[:, 0, 16, 16]
    assert np.abs(red - np.arange(10) * 20).max() <= 3  # JPEG is lossy


# ----------------------------------------------------------------------------- torchvision


def test_emnist_images_are_turned_upright(tmp_path, monkeypatch):
    upright = np.zeros((28, 28), dtype=np.uint8)
    upright[:, 3] = 255  # a vertical bar

    class FakeEMNIST:
        classes = [str(i) for i in range(47)]

        def __init__(self, root, download, split, train):
            assert split == "balanced"
            self.data = torch.from_numpy(np.stack([upright.T] * 47))  # stored transposed
            self.targets = torch.arange(47)  # every class present (a complete split)

    monkeypatch.setattr(torchvision.datasets, "EMNIST", FakeEMNIST)
    emnist = load_dataset("emnist", root=tmp_path)
    assert (pixel_values(emnist.x_train, emnist)[0, 0] == upright).all()
    assert emnist.num_classes == 47 and emnist.y_test.tolist() == list(range(47))


def test_eurosat_split_is_stratified_and_seeded(tmp_path, monkeypatch):
    samples = []
    for label in range(2):
        for index in range(10):
            path = tmp_path / f"{label}_{index}.jpg"
            Image.new("RGB", (64, 64), (label * 100, index * 10, 0)).save(path)
            samples.append((str(path), label))
    (tmp_path / "eurosat" / "2750").mkdir(parents=True)

    class FakeEuroSAT:
        classes = ["Forest", "River"]

        def __init__(self, root, download):
            self.samples = samples

    monkeypatch.setattr(torchvision.datasets, "EuroSAT", FakeEuroSAT)
    first = load_dataset("eurosat", root=tmp_path)
    assert first.y_train.bincount().tolist() == [8, 8]
    assert first.y_test.bincount().tolist() == [2, 2]
    assert first.input_shape == (3, 64, 64) and "seed 0" in first.source
    again = load_dataset("eurosat", root=tmp_path, cache_dir=tmp_path / "other-cache")
    assert torch.equal(first.x_test, again.x_test)


def test_download_failure_is_one_line_not_found(tmp_path, monkeypatch):
    def unreachable(*args, **kwargs):
        raise urllib.error.URLError("no network\nat all")

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", unreachable)
    with pytest.raises(DataNotFoundError) as error:
        load_dataset("cifar100", root=tmp_path, download=True)
    message = assert_one_line(error)
    assert "download failed" in message and str(tmp_path / "cifar-100-python") in message
    assert error.value.__cause__ is None and error.value.__suppress_context__


# ----------------------------------------------------------------------------- missing data


def test_missing_fmnist_names_every_path(tmp_path, monkeypatch):
    monkeypatch.setattr(data_sources, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian")
    with pytest.raises(DataNotFoundError) as error:
        load_dataset("fmnist", root=tmp_path / "root", download=False)
    message = assert_one_line(error)
    for path in ("no-debian", "root/fashion-mnist", "root/FashionMNIST/raw"):
        assert str(tmp_path / path) in message
    assert "apt-get install dataset-fashion-mnist" in message and "download disabled" in message


@pytest.mark.parametrize(
    "name, places",
    [
        ("mnist", ["mnist", "MNIST/raw"]),
        ("cifar10", ["cifar-10-batches-py", "cifar10-jpeg/cifar10-jpeg.tar.gz"]),
        ("cifar100", ["cifar-100-python"]),
        ("svhn", ["train_32x32.mat", "test_32x32.mat"]),
        ("emnist", ["EMNIST/raw"]),
        ("eurosat", ["eurosat/2750"]),
    ],
)
def test_missing_data_is_one_line_and_names_paths(tmp_path, name, places):
    with pytest.raises(DataNotFoundError) as error:
        load_dataset(name, root=tmp_path)  # FEDLIB_DOWNLOAD=0 from the fixture
    message = assert_one_line(error)
    assert message.startswith(f"{name}: ")
    for place in places:
        assert str(tmp_path / place) in message
    assert "FEDLIB_DATA" in message


def test_default_root_and_download_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert data.default_data_root() == tmp_path / "data"
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "elsewhere"))
    assert data.default_data_root() == tmp_path / "elsewhere"
    with pytest.raises(DataNotFoundError, match="elsewhere/mnist"):
        load_dataset("mnist")
    monkeypatch.setenv("FEDLIB_DOWNLOAD", "yes")
    with pytest.raises(ValueError, match="FEDLIB_DOWNLOAD"):
        load_dataset("mnist")


# ----------------------------------------------------------------------------- names and specs


@pytest.mark.parametrize("name", ["imagenet", "FMNIST", "imagefolder:", ""])
def test_unknown_name_is_one_line_value_error(name):
    with pytest.raises(ValueError) as error:
        load_dataset(name)
    message = assert_one_line(error)
    assert all(known in message for known in data.DATASETS) and "imagefolder:<path>" in message


def test_options_only_for_synthetic():
    with pytest.raises(TypeError, match="no options"):
        load_dataset("mnist", seed=1)


@pytest.mark.parametrize(
    "name, spec",
    [
        ("fmnist", ((1, 28, 28), 10)),
        ("mnist", ((1, 28, 28), 10)),
        ("cifar10", ((3, 32, 32), 10)),
        ("cifar100", ((3, 32, 32), 100)),
        ("svhn", ((3, 32, 32), 10)),
        ("emnist", ((1, 28, 28), 47)),
        ("eurosat", ((3, 64, 64), 10)),
        ("synthetic", ((1, 28, 28), 10)),
        ("imagefolder:/any/path", None),
    ],
)
def test_dataset_spec(name, spec):
    assert dataset_spec(name) == spec


def test_every_known_name_has_a_spec():
    assert all(dataset_spec(name) is not None for name in data.DATASETS)
    with pytest.raises(ValueError):
        dataset_spec("imagenet")


def test_fingerprint_names_the_files_read_and_is_cheap(tmp_path, monkeypatch):
    """The data fingerprint hashes the files a load reads (not where they are); it is kept on disk
    by path, size and mtime, so the key needs no decoding."""
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))
    write_tiny_mnist(tmp_path / "a" / "mnist")
    write_tiny_mnist(tmp_path / "b" / "MNIST" / "raw")  # same files, torchvision layout
    a = data.data_fingerprint("mnist", tmp_path / "a")
    assert a["source"] == "mnist idx files (mnist)"  # the dataset, not where it sat
    assert [name for name, _ in a["files"]][0] == "t10k-images-idx3-ubyte.gz" and len(a["files"]) == 4
    assert data.data_fingerprint("mnist", tmp_path / "b")["sha256"] == a["sha256"]
    assert load_dataset("mnist", root=tmp_path / "a").fingerprint == a
    assert len(list((tmp_path / "cache" / "fingerprints").glob("*.json"))) == 2
    (tmp_path / "b" / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 10]) + bytes(range(9, -1, -1))))
    assert data.data_fingerprint("mnist", tmp_path / "b")["sha256"] != a["sha256"]
    missing = data.data_fingerprint("mnist", tmp_path / "none")
    assert missing["sha256"] is None and str(tmp_path / "none" / "mnist") in missing["missing"]
