"""The queue's cost model (:class:`CostModel`): what a run or a pack costs on a device, from the stored runs' times
(the package's docstring, "Cost model"); the fallback rates, method factors and per-run start-up it uses."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ... import data
from ...cache import ResultCache, key_of
from ...models import MODELS, build_model
from ...plans import step_flops
from ...store import list_store
from ..kit.items import _get, method_name, runner_kind, work
from .store import stores

# seconds per 1,000 training-sample passes when nothing similar is stored (order of magnitude)
# (the wider CNN's: the CNN's times their FLOPs per CIFAR-10 sample, 15.78 / 4.66 MFLOP, model_flops)
FALLBACK_SECONDS_PER_1000 = {
    "cpu": {"mlp": 0.05, "lenet5": 0.3, "cnn": 1.5, "cnn_wide": 5.08, "resnet20": 6.0, "resnet18": 25.0,
            "vgg11": 20.0},
    "cuda": {"mlp": 0.005, "lenet5": 0.01, "cnn": 0.0103, "cnn_wide": 0.0349, "resnet20": 0.08, "resnet18": 0.15,
             "vgg11": 0.1},
}
# a model without stored runs on a device is estimated from another model's runs there, scaled by their FLOPs
# per sample, only when these are within this factor of each other: beyond it the fixed cost of a step (launches
# on a GPU) makes the scaling wrong (from the CNN, a ResNet-20 run on an H100 would be put at 5.6 h)
SCALE_WITHIN = 4.0
FALLBACK_UNKNOWN_MODEL = {"cpu": 5.0, "cuda": 0.1}
# augmented runs (crop + flip per sample and step) are timed apart from plain ones; with none stored, a plain
# rate times this: on an H100 a pack of 3 augmented CELM CIFAR-10 runs took 62.6 s per run, a pack of 2 plain
# ones 43.2 s (2026-11-27; the larger pack's own cost included, so an upper bound)
AUGMENT_FACTOR = 1.45
# extra server work per round relative to FedAvg (Shapley-type valuations evaluate many subsets)
METHOD_FACTOR = {"fedsv": 5.0, "gtg_shapley": 3.0, "fedms": 3.0, "greedyfed": 3.0, "s_fedavg": 1.5,
                 "shapley_rewards": 3.0}
STARTUP_SECONDS = 15.0  # process start, imports, data loading (measured 10-30 s on a shared 2-core machine)


# FedSCM federations packed at most: a table's α x seeds (3 x 3). Their one-shot stages' sample pools are


# ----------------------------------------------------------------------------- cost


def model_flops(model: str, dataset: str) -> float | None:
    """Forward FLOPs of one ``dataset`` sample through ``model`` (``fedlib.population.step_flops``), or None
    for a model or dataset without a fixed input shape here. Counted once per pair."""
    key = (model, dataset)
    if key not in _MODEL_FLOPS:
        flops = None
        try:
            spec = data.dataset_spec(dataset) if model in MODELS else None
            if spec is not None:
                shape, classes = spec
                flops = step_flops(build_model(model, shape, classes), torch.zeros(*shape), 1) or None
        except ValueError:  # an unknown dataset, or a model that does not take its input (vgg11 needs 32 x 32)
            flops = None
        _MODEL_FLOPS[key] = flops
    return _MODEL_FLOPS[key]


_MODEL_FLOPS: dict[tuple[str, str], float | None] = {}


def device_kind(device: str | None) -> str:
    return "cuda" if device and ("cuda" in device.lower() or "gpu" in device.lower()) else "cpu"


@dataclass
class CostModel:
    """Seconds a run will take, from stored wall times (see the module docstring)."""

    samples: list[tuple[tuple, float]] = field(default_factory=list)  # (signature, seconds per pass)

    @classmethod
    def from_results(cls, root: Path | None = None) -> "CostModel":
        model = cls()
        roots = [root] if root is not None else sorted({s.runs for s in stores()})
        for run in (run for r in roots for run in list_store(r).runs):  # the valid entries only
            model.read_entry(run.stored)  # config, wall time and meta: the history stays encoded
        return model

    packed: list[tuple[tuple, float]] = field(default_factory=list)  # the same, of runs trained in packs
    # what this queue measured itself, on this machine: it comes before any older store (see estimate)
    fresh: list[tuple[tuple, float]] = field(default_factory=list)
    fresh_packed: list[tuple[tuple, float]] = field(default_factory=list)

    def read(self, path: Path, fresh: bool = False) -> None:
        """Add one stored run (skipped unless a valid store file: bounded size, valid checksum)."""
        payload, _ = ResultCache(path.parent, protect=True).read(key_of(path))
        if payload is not None:
            self.read_entry(payload, fresh)

    def read_entry(self, payload: dict, fresh: bool = False) -> None:
        """Add one stored entry (``stored_payload``); one whose fields do not make a sample is skipped."""
        try:
            config, wall = payload["config"], float(payload.get("wall_time") or 0)
            pack = ((payload.get("result") or {}).get("meta") or {}).get("pack") or {}
            self.add(config, wall, payload.get("device"), int(pack.get("size", 1)), fresh=fresh,
                     pack_methods=pack.get("methods"))
        except (ValueError, KeyError, TypeError, AttributeError, OSError):
            return

    def add(self, config, wall_time: float, device: str | None, pack_size: int = 1, fresh: bool = False,
            pack_methods: list[str] | None = None) -> None:
        """One stored run; a run of a pack of ``pack_size`` took the pack's wall time, shared by its runs. A
        packed sample whose pack records its methods is kept per unit of :data:`METHOD_FACTOR` (the pack's
        mean factor divided out), so :meth:`packed_rate` can scale it to any method."""
        if wall_time < 1.0:  # served from a cache, not a measurement
            return
        w = work(config)
        if w > 0:
            rate = wall_time / w / pack_size
            if pack_size > 1:  # a pack that did not record its mix counts as one of this run's method
                rate /= statistics.mean(METHOD_FACTOR.get(m, 1.0) for m in (pack_methods or [method_name(config)]))
            sample = (self._signature(config, device_kind(device)), rate)
            if fresh:
                (self.fresh_packed if pack_size > 1 else self.fresh).append(sample)
            (self.packed if pack_size > 1 else self.samples).append(sample)

    def packed_rate(self, config, device: str = "cpu") -> float | None:
        """Median seconds per sample pass of stored packed runs like this one (same device kind, runner,
        model and dataset), this queue's own measurements first, times the config's method factor; or None.
        (A pack's runs share one wall time whatever their methods; :meth:`add` keeps its samples per unit
        of factor.)"""
        found = self.packed_estimate(config, device)
        return None if found is None else found[0]

    def packed_estimate(self, config, device: str = "cpu") -> tuple[float, str] | None:
        """(:meth:`packed_rate`, how): 'measured', 'measured plain runs x augmentation', or for a model with
        no packed run on this kind of device the FLOP-scaled rate of other models' (:meth:`scaled_rate`)."""
        sig = self._signature(config, device_kind(device))
        factor = METHOD_FACTOR.get(method_name(config), 1.0)
        for samples in (self.fresh_packed, self.packed):
            rates = [r for s, r in samples if all(s[i] == sig[i] for i in (0, 1, 2, 4))]
            if rates:
                return statistics.median(rates) * factor, "measured"
        plain = self._plain_rate(config, (0, 1, 2, 4), device_kind(device), packed=True)
        if plain is not None:
            return plain * factor, "measured plain runs x augmentation"
        return self.scaled_rate(config, device, packed=True)

    def scaled_rate(self, config, device: str = "cpu", packed: bool = False) -> tuple[float, str] | None:
        """(seconds per pass, how) for a model with no stored run on this kind of device: the median rate of
        other models' runs of the same runner, dataset and augmentation, with FLOPs per sample within
        :data:`SCALE_WITHIN` times this model's (the same method's first, unless
        ``packed``: packed rates are per unit of method factor; runs of the same size first), each times
        :func:`model_flops` of this model over its own. None when there are none, or FLOPs are unknown."""
        sig = self._signature(config, device_kind(device))
        model, _, augment = sig[2].partition(" + ")
        mine = model_flops(model, sig[4])
        if mine is None:
            return None
        factor = METHOD_FACTOR.get(method_name(config), 1.0)

        def similar(other: str) -> bool:  # a model of like size (small ones are launch-bound on a GPU)
            flops = model_flops(other, sig[4])
            return other != model and flops is not None and 1 / SCALE_WITHIN <= mine / flops <= SCALE_WITHIN

        others = [(s, r) for s, r in (self.packed if packed else self.samples)
                  if s[:2] == sig[:2] and s[4] == sig[4] and s[2].partition(" + ")[2] == augment
                  and similar(s[2].partition(" + ")[0])]
        if packed:
            tiers = [([x for x in others if x[0][5] == sig[5]], factor), (others, factor)]
        else:
            same = [x for x in others if x[0][3] == sig[3]]
            tiers = [([x for x in same if x[0][5] == sig[5]], 1.0), (same, 1.0),
                     ([x for x in others if x[0][5] == sig[5]], factor), (others, factor)]
        for group, scale in tiers:
            if group:
                rates = [r * mine / model_flops(s[2].partition(" + ")[0], s[4]) for s, r in group]
                names = ", ".join(sorted({s[2].partition(" + ")[0] for s, _ in group}))
                return statistics.median(rates) * scale, f"scaled from {names} by FLOPs ({len(rates)})"
        return None

    @staticmethod
    def _signature(config, kind: str) -> tuple:
        model, augment = _get(config, "model"), _get(config, "augment")  # augmented runs are their own kind
        return (kind, runner_kind(config), f"{model} + {augment}" if augment else model, method_name(config),
                _get(config, "dataset"), work(config))

    def _plain_rate(self, config, fields: tuple, kind: str, packed: bool) -> float | None:
        """For an augmented config with no augmented sample: the median rate of its plain twin's samples."""
        if not _get(config, "augment"):
            return None
        sig = self._signature(config, kind)
        sig = sig[:2] + (_get(config, "model"),) + sig[3:]  # its plain twin
        rates = [r for samples in ((self.fresh_packed, self.packed) if packed else (self.fresh, self.samples))
                 for s, r in samples if all(s[i] == sig[i] for i in fields)]
        return statistics.median(rates) * AUGMENT_FACTOR if rates else None

    def estimate(self, config, device: str = "cpu") -> tuple[float, str]:
        """(seconds, how: 'measured (n runs)' or 'fallback')."""
        kind = device_kind(device)
        sig = self._signature(config, kind)
        factor = METHOD_FACTOR.get(method_name(config), 1.0)
        # the most similar stored runs (the signature's fields that match; see the module docstring); runs this
        # queue measured on this machine (same runner, model and dataset) come before older stores
        ladder = [(self.fresh, (0, 1, 2, 3, 4), 1.0), (self.fresh, (0, 1, 2, 4), factor)] + [
            (self.samples, fields, scale) for fields, scale in
            (((0, 1, 2, 3, 4), 1.0), ((0, 1, 2, 3), 1.0), ((0, 1, 2), factor), ((0, 2), factor))]
        for samples, fields, scale in ladder:
            rates = [r for s, r in samples if all(s[i] == sig[i] for i in fields)]
            if rates:
                return STARTUP_SECONDS + statistics.median(rates) * work(config) * scale, f"measured ({len(rates)})"
        plain = self._plain_rate(config, (0, 1, 2), kind, packed=False)
        if plain is not None:
            return STARTUP_SECONDS + plain * work(config) * factor, "measured plain runs x augmentation"
        scaled = self.scaled_rate(config, device)
        if scaled is not None:
            return STARTUP_SECONDS + scaled[0] * work(config), scaled[1]
        per_1000 = FALLBACK_SECONDS_PER_1000[kind].get(_get(config, "model"), FALLBACK_UNKNOWN_MODEL[kind])
        augment = AUGMENT_FACTOR if _get(config, "augment") else 1.0
        return STARTUP_SECONDS + per_1000 * work(config) / 1000 * factor * augment, "fallback"
