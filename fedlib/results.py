"""The results layer: a run's result as JSON-ready data (``RunResult``), the checks a stored
or cached payload must pass (``check_result``, ``result_check``) and the provenance a run
records (what produced it: key, config, rule versions, data, versions, device, date).

Every runner returns one record, a ``RunResult``: an engine run's (config, its rounds' ``history``,
``final`` scores, ``meta``) and a pipeline's, FedSCM's (``fedlib.scm_pipeline``): the same four,
with an empty history (one-shot: its post-trainings' rounds are not the record's), ``final`` of
its headline method (:func:`pipeline_final`), and its further sections in ``parts`` (methods,
selections, clients, target_proportions, diagnosis, stability when run). ``to_dict`` puts the
parts at the top level beside the four, as FedSCM results were always stored; ``from_dict``
reads those, including the ones stored before the record had a history and a final.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import provenance
from .config import ENGINE_VERSION, RunConfig
from .data import Dataset, tensor_fingerprint

__all__ = ["RunResult", "check_result", "is_pipeline_result", "pipeline_final", "result_check"]


RECORD_FIELDS = ("config", "history", "final", "meta")  # every record's; a pipeline's parts sit beside them
HEADLINE_PREFIX = "FedSCM ("  # a pipeline's headline rows: FedSCM's, one per γ ("FedSCM (γ = 0.67)")


def is_pipeline_result(data: Any) -> bool:
    """Whether ``data`` is a pipeline's (FedSCM's) result as JSON: it has a table of ``methods``."""
    return isinstance(data, dict) and isinstance(data.get("methods"), dict)


def pipeline_final(methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A pipeline record's ``final``: the method it names (``method``) and that method's accuracy and
    balanced accuracy on the labelled target set. The method is the first FedSCM row of the table,
    i.e. FedSCM at the config's first γ (the rows follow ``config.methods``, FedSCM's in ``config.gammas``'
    order), else the table's first row; scores None when the table is empty."""
    label = next((m for m in methods if m.startswith(HEADLINE_PREFIX)), next(iter(methods), None))
    row = methods.get(label) or {}
    return {"method": label, "accuracy": row.get("accuracy"), "balanced_accuracy": row.get("balanced_accuracy")}


@dataclass
class RunResult:
    """Everything a run produced, as JSON-ready data: the record every runner returns (the module's
    docstring). ``parts`` holds a pipeline's further sections by name (FedSCM: ``parts["methods"]``,
    ...); an engine run has none."""

    config: dict[str, Any]
    history: list[dict[str, Any]]
    final: dict[str, Any]
    meta: dict[str, Any]
    parts: dict[str, Any] = field(default_factory=dict)
    model: Any = field(default=None, repr=False, compare=False)  # (flat, buffers) when asked for

    def __post_init__(self):
        clash = [name for name in self.parts if name in RECORD_FIELDS]
        if clash:
            raise ValueError(f"RunResult: a part cannot be named {clash[0]!r} (a field of every record)")

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "history": self.history, "final": self.final, "meta": self.meta,
                **self.parts}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """The record of a result's JSON (``to_dict``'s layout). A pipeline's result stored before the
        record had a history and a final (FedSCM's sections, config and meta only) gets an empty history
        and its :func:`pipeline_final`."""
        parts = {k: v for k, v in data.items() if k not in RECORD_FIELDS}
        if is_pipeline_result(data):
            history, final = data.get("history", []), data.get("final") or pipeline_final(data["methods"])
        else:
            history, final = data["history"], data["final"]
        return cls(data["config"], history, final, data["meta"], parts)

    def series(self, key: str) -> tuple[list[int], list[Any]]:
        """(rounds, values) of a per-round metric, skipping rounds without it."""
        rows = [(h["round"], h[key]) for h in self.history if h.get(key) is not None]
        return [r for r, _ in rows], [v for _, v in rows]

    def summary(self) -> str:
        """A small text table: round, accuracy, balanced accuracy, seconds."""
        lines = [f"{'round':>5}  {'acc':>7}  {'bal.acc':>7}  {'train s':>7}  {'server s':>8}"]
        for h in self.history:
            if h.get("accuracy") is None:
                continue
            lines.append(
                f"{h['round'] + 1:>5}  {100 * h['accuracy']:>6.2f}%  {100 * h['balanced_accuracy']:>6.2f}%"
                f"  {h['time_train']:>7.2f}  {h['time_server']:>8.3f}"
            )
        f = self.final
        scores = ("no evaluated round" if f["accuracy"] is None else
                  f"accuracy {100 * f['accuracy']:.2f}%, balanced accuracy {100 * f['balanced_accuracy']:.2f}%")
        setup = [f"{label} {self.meta[k]:.1f} s" for k, label in (("time_load", "data and model"),
                                                                  ("warmup_s", "torch.func warm-up"))
                 if self.meta.get(k)]
        method = f" ({f['method']})" if f.get("method") else ""  # a pipeline's final names its method
        lines.append(f"final{method}: {scores}, wall {self.meta['wall_time']:.1f} s on {self.meta['device']}"
                     + (f" (set-up before round 1, not in wall: {', '.join(setup)})" if setup else "")
                     + (f"\nstopped early: {f['stopped']}" if f.get("stopped") else ""))
        return "\n".join(lines)


def _fingerprint_of(config: RunConfig, dataset: Dataset | None) -> dict:
    """The data fingerprint: of the given Dataset (its files', else its tensors'), else of the files
    the config reads."""
    if dataset is None:
        return config.data_fingerprint()
    if dataset.fingerprint is None:
        dataset.fingerprint = tensor_fingerprint(dataset)
    return dataset.fingerprint


def _key_provenance(config: RunConfig, fingerprint: dict, key: str) -> dict[str, Any]:
    """What produced a result: the key, the resolved hyper-parameters, the rule versions and the data."""
    return {"config_key": key, "config_key_without_data": config.config_key(), "resolved": config.resolved(),
            "rule_versions": config.rule_versions(),
            "data": {k: fingerprint.get(k) for k in ("source", "files", "sha256")}}


PLACEMENT_FIELDS = ("device",)  # where a run ran (recorded in meta.device), not what it computes


def placement_free(resolved: dict | None) -> dict | None:
    """A resolved config without its placement: the results queue runs a chapter's CPU config on a
    GPU and stores it under the chapter's key, so a stored run answers the config on any device."""
    return None if resolved is None else {k: v for k, v in resolved.items() if k not in PLACEMENT_FIELDS}


def result_check(config: RunConfig, fingerprint: dict) -> Callable[[dict], str | None]:
    """A check for ``ResultCache.get``: None when a stored run payload answers ``config`` on the data
    ``fingerprint`` describes (same resolved config, rule versions and data; a valid result),
    else what is wrong."""

    def check(payload: dict) -> str | None:
        problem = check_result(payload)
        if problem:
            return problem
        meta = payload["meta"]
        if placement_free(meta.get("resolved")) != placement_free(config.resolved()):
            return "its config is not the requested one"
        if meta.get("rule_versions") != config.rule_versions():
            return f"computed with rule versions {meta.get('rule_versions')}, now {config.rule_versions()}"
        if (meta.get("data") or {}).get("sha256") != fingerprint.get("sha256"):
            return "computed on other data"
        return None

    return check


def _score(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value) and 0.0 <= value <= 1.0)


def check_result(payload: Any) -> str | None:
    """None when ``payload`` has the schema of ``RunResult.to_dict()`` with valid values (scores
    null or finite in [0, 1]), else the first problem found."""
    if not isinstance(payload, dict) or not all(isinstance(payload.get(k), t) for k, t in
                                                (("config", dict), ("history", list), ("final", dict),
                                                 ("meta", dict))):
        return "not a run result (needs config, history, final, meta)"
    final = payload["final"]
    for name in ("accuracy", "balanced_accuracy", "f1"):
        if not _score(final.get(name)):
            return f"final.{name} is not a score in [0, 1] (got {str(final.get(name))[:40]})"
    per_class = final.get("per_class_accuracy", [])
    if not isinstance(per_class, list) or not all(_score(v) for v in per_class):
        return "final.per_class_accuracy is not a list of scores"
    rounds = final.get("rounds_completed")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds != len(payload["history"]):
        return "final.rounds_completed does not match the history"
    for record in payload["history"]:
        if not isinstance(record, dict) or not isinstance(record.get("round"), int):
            return "a history record has no round"
        if not all(_score(record.get(k)) for k in ("accuracy", "balanced_accuracy")):
            return f"round {record['round']}: accuracy is not a score in [0, 1]"
    return None


def _strict(record: dict[str, Any]) -> dict[str, Any]:
    """Non-finite floats become null; their places are listed in ``record["non_finite"]`` (strict JSON)."""
    found: list[str] = []

    def clean(value, where):
        if isinstance(value, float) and not math.isfinite(value):
            found.append(where)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{where}.{k}" if where else k) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    out = clean(record, "")
    if found:
        out["non_finite"] = found[:20] + ([f"... {len(found) - 20} more"] if len(found) > 20 else [])
    return out


def environment(device: torch.device, wall: float) -> dict[str, Any]:
    """A run's environment (``fedlib.provenance.environment``; its commit is recorded when it is stored)."""
    return provenance.environment(device, wall, commit=False)


def _provenance(p, wall: float) -> dict[str, Any]:
    """A run's provenance: its key, the environment (:func:`environment`), its data and clients."""
    return {
        "config_key": p.config.key(), **environment(p.device, wall), "dataset_source": p.dataset.source,
        "engine_version": ENGINE_VERSION, "client_sizes": np.asarray(p.partition.sizes).tolist(),
        "client_roles": list(p.partition.roles), "client_class_counts": np.asarray(p.partition.counts).tolist(),
        "model_parameters": sum(t.numel() for t in p.model.parameters()),
        # local training's arithmetic (RunConfig.precision; float32 unless the config says bfloat16)
        "precision": getattr(p.config, "precision", "float32"),
    }
