"""Issue 43, point 5: bad input is refused as a class. Property-based tests (Hypothesis) over the whole config
space: configs drawn from the schema itself (every field of RunConfig and ScmConfig, from its type and
bounds) and from the split registry's declared parameters, then mutated (missing, wrong-typed, huge, NaN,
negative values, unknown and huge keys, NUL bytes, paths to loops, devices, FIFOs and missing files).
Each either validates (and then resolves and keys the same way twice) or fails with the project's
ConfigError in one line of bounded length. Nothing trains but a few one-round runs of a tiny synthetic
federation. Seeded (derandomized) and small: the whole file runs in seconds.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import typing
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fedlib  # noqa: E402
from fedlib import partition  # noqa: E402
from fedlib.config import SCM_METHODS, ConfigError, RunConfig, ScmConfig, Spec, load_config, make_config  # noqa: E402
from fedlib.data import DATASETS  # noqa: E402
from fedlib.errors import MAX_MESSAGE, SHOWN_CHARS, clipped, shown  # noqa: E402
from fedlib.limits import MAX_WORKERS, check_device, check_port, check_workers  # noqa: E402
from fedlib.models import MODELS  # noqa: E402

SETTINGS = dict(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HUGE_KEY = "k" * 1_000_000  # the probe's 1 MB split-parameter key
VOCABULARY = re.compile(r"; (?:allowed keys|allowed|known): ")  # the project's own names listed after an error


def one_line(err: BaseException) -> str:
    """The message of a refused input: one line, no traceback, user input echoed short (the part before a
    list of the project's allowed names at most ~300 characters; the whole at most MAX_MESSAGE)."""
    message = str(err)
    assert isinstance(err, ConfigError), f"{type(err).__name__}: {message[:300]}"
    assert message and "\n" not in message and "\r" not in message and "Traceback" not in message, message[:300]
    assert len(VOCABULARY.split(message)[0]) <= 300, message[:400]
    assert len(message) <= MAX_MESSAGE + 1
    assert "\x00" not in message
    return message


def validates_or_refuses(make, data) -> tuple[object | None, str | None]:
    """(config, None) when ``data`` validates, else (None, its one-line message); any other exception fails."""
    try:
        config = make(data)
    except ConfigError as err:
        message = one_line(err)
        hypothesis.event("refused", re.sub(r"^config: |[:(;].*$", "", message))  # which field (--hypothesis-show-statistics)
        return None, message
    hypothesis.event("validated")
    return config, None


# ------------------------------------------------------------------- paths that are not data

@pytest.fixture(scope="module")
def special_paths():
    """A loop of symbolic links, a FIFO, a regular file, a missing path, a link to /dev/zero, a NUL byte."""
    root = Path(tempfile.mkdtemp(prefix="fedlib-input-space-"))
    (root / "loop_a").symlink_to(root / "loop_b")
    (root / "loop_b").symlink_to(root / "loop_a")
    os.mkfifo(root / "fifo")
    (root / "file.txt").write_text("not a folder")
    (root / "zero").symlink_to("/dev/zero")
    (root / "ok.yaml").write_text("dataset: synthetic\nrounds: 1\n")
    paths = {"loop": str(root / "loop_a"), "inside_loop": str(root / "loop_a" / "x"), "fifo": str(root / "fifo"),
             "file": str(root / "file.txt"), "dev_zero": "/dev/zero", "dev_null": "/dev/null",
             "link_to_dev_zero": str(root / "zero"), "nul": str(root / "a\x00b"), "dev": "/dev",
             "long_name": str(root / ("n" * 300)), "missing": str(root / "missing" / "deeper")}
    yield root, paths
    import shutil

    shutil.rmtree(root, ignore_errors=True)


REFUSED_AS_DATA_ROOT = ("loop", "inside_loop", "fifo", "file", "dev_zero", "dev_null", "link_to_dev_zero", "nul", "dev",
                        "long_name")
REFUSED_AS_CONFIG_FILE = ("loop", "inside_loop", "fifo", "dev_zero", "dev_null", "link_to_dev_zero", "nul", "dev",
                          "long_name", "missing")


@settings(max_examples=30, **SETTINGS)
@given(kind=st.sampled_from(REFUSED_AS_DATA_ROOT + ("missing",)), field=st.sampled_from(["data_root", "imagefolder"]),
       model=st.sampled_from([RunConfig, ScmConfig]))
@example(kind="loop", field="data_root", model=RunConfig)  # the probe: a symlink loop as data_root
@example(kind="dev_zero", field="data_root", model=RunConfig)  # the probe: /dev/zero as data root
@example(kind="nul", field="data_root", model=RunConfig)  # the probe: a NUL byte
def test_a_path_that_cannot_be_data_is_refused_in_one_line_naming_the_field(special_paths, kind, field, model):
    _, paths = special_paths
    path = paths[kind]
    data = {"data_root": path} if field == "data_root" else {"dataset": f"imagefolder:{path}"}
    config, message = validates_or_refuses(model.make, data)
    if kind == "missing" or (field == "imagefolder" and kind == "file"):  # may appear later / an archive
        assert config is not None
        return
    assert config is None, (kind, field)
    assert message.startswith(f"config: {'data_root' if field == 'data_root' else 'dataset'}: ")
    assert "(refused)" in message
    assert clipped(path, 2 * SHOWN_CHARS) in message  # the path, printable and short


@settings(max_examples=20, **SETTINGS)
@given(kind=st.sampled_from(REFUSED_AS_CONFIG_FILE))
@example(kind="loop")  # the probe: a symlink loop as the config file
@example(kind="dev_zero")  # the probe: /dev/zero as the config file
@example(kind="nul")
def test_a_config_file_path_that_is_not_a_file_is_refused_in_one_line(special_paths, kind):
    _, paths = special_paths
    with pytest.raises(ConfigError) as info:
        load_config(paths[kind])
    message = one_line(info.value)
    assert clipped(paths[kind], 2 * SHOWN_CHARS) in message


def test_the_reported_path_cases_print_these_lines(special_paths):
    root, paths = special_paths
    with pytest.raises(ConfigError, match=r"^config file /dev/zero is under /dev \(a device, not data\) \(refused\)$"):
        load_config("/dev/zero")
    with pytest.raises(ConfigError, match=r"is a loop of symbolic links \(refused\)$"):
        load_config(paths["loop"])
    with pytest.raises(ConfigError, match=r"^config: data_root: .*/a\\x00b contains a NUL byte \(refused\)$"):
        make_config(data_root=paths["nul"])
    with pytest.raises(ConfigError, match=r"^config: data_root: /dev/zero is under /dev"):
        make_config(data_root="/dev/zero")
    with pytest.raises(ConfigError, match=r"^config: data_root: .* is a file, not a directory \(refused\)$"):
        make_config(data_root=paths["file"])
    with pytest.raises(ConfigError, match=r"^config file: expected a path, got NoneType None$"):
        load_config(None)
    assert load_config(root / "ok.yaml").rounds == 1
    with pytest.raises(fedlib.data_files.DataNotFoundError, match="is a loop of symbolic links; refused$"):
        fedlib.data.load_dataset("mnist", paths["loop"], download=True)  # the loader checks the same, first


# ------------------------------------------------------------------- split parameters, from the registry

def _accepted_values(parameter: partition.SplitParameter) -> st.SearchStrategy:
    """Values the declaration accepts (its type, within its range), small enough to validate quickly."""
    candidates = {"bool": [False, True], "int": list(range(13)), "float": [0.0, 0.05, 0.1, 0.5, 1.0, 2.0, 1e6],
                  "list[int]": [[], [1], [1, 2], [2, 3, 1]]}[parameter.type] + ([None] if parameter.optional else [])
    accepted = [v for v in candidates if parameter.accepts(v)]
    assert accepted, parameter
    return st.sampled_from(accepted)


@st.composite
def split_specs(draw, kinds=partition.SPLITS) -> dict:
    """A split as a config writes it: a kind, every required parameter and some optional ones, each a
    value its declaration accepts."""
    kind = partition.SPLIT_KINDS[draw(st.sampled_from(kinds))]
    spec = {"name": kind.name}
    for name, parameter in kind.declared.items():
        if parameter.required or draw(st.integers(0, 4)) == 0:
            spec[name] = draw(_accepted_values(parameter))
    return spec


@settings(max_examples=60, **SETTINGS)
@given(spec=split_specs(), n_clients=st.integers(1, 12))
def test_a_split_the_registry_accepts_validates_or_fails_only_on_the_federation(spec, n_clients):
    """Declared values always pass the split check; the config adds only the federation's checks (k within
    the dataset's classes, noisy clients among the clients)."""
    config, message = validates_or_refuses(make_config, {"dataset": "synthetic", "n_clients": n_clients,
                                                         "split": spec})
    if config is None:
        assert re.match(r"config: split\.(k|noisy_clients): ", message), message
        return
    assert config.split.name == spec["name"]
    resolved = config.resolved()["split"]
    later = partition.ADDED_LATER.get(spec["name"], {})  # a parameter added later stays out of the key at its default
    assert {k: v for k, v in resolved.items() if k in spec} == {k: list(v) if isinstance(v, tuple) else v
                                                                for k, v in spec.items()
                                                                if not (k in later and v == later[k])}
    assert make_config(config.to_dict()).config_key() == config.config_key()  # the same config keys the same


EXPECTED_TYPES = {"int": "an integer", "float": "a number", "bool": "true or false", "list[int]": "a list of integers"}
WRONG_VALUES = {"int": ["3", 2.5, True, [1], None, {"a": 1}, 10**400], "float": ["x", True, [0.5], None, {}],
                "bool": [1, "yes", None, 0.0], "list[int]": [1, "1,2", [1.5], [True], [-1], {"a": 1}]}


@pytest.mark.parametrize("kind", partition.SPLITS)
def test_every_split_kind_names_itself_the_parameter_and_what_it_expects(kind):
    """Derived from the declarations, for every split kind: each required parameter left out, and each
    declared parameter given values of the wrong type, fail in one line naming the split, the parameter
    and the expected type and range."""
    declared = partition.SPLIT_KINDS[kind].declared
    valid = {name: 1.0 if p.type == "float" else 1 for name, p in declared.items() if p.required}
    for name in (n for n, p in declared.items() if p.required):
        params = {k: v for k, v in valid.items() if k != name}
        with pytest.raises(ConfigError) as info:
            make_config(dataset="synthetic", split={"name": kind, **params})
        assert one_line(info.value) == (f"config: split.{name}: missing; split '{kind}' needs it: "
                                        f"{declared[name].expected()}")
    for name, parameter in declared.items():
        for value in WRONG_VALUES[parameter.type]:
            if value is None and parameter.optional:
                continue
            with pytest.raises(ConfigError) as info:
                make_config(dataset="synthetic", split={"name": kind, **valid, name: value})
            message = one_line(info.value)
            assert message.startswith(f"config: split.{name}: split '{kind}' needs {EXPECTED_TYPES[parameter.type]}")
            assert message.endswith(f"(got {'null' if value is None else shown(value)})"), message


@pytest.mark.parametrize("spec, text", [
    ({"name": "dirichlet"}, "config: split.alpha: missing; split 'dirichlet' needs it: a number in (0, 1e+06]"),
    ({"name": "maverick"}, "config: split.n_mavericks: missing; split 'maverick' needs it: an integer in [0, 100000]"),
    ({"name": "maverick", "n_mavericks": 1}, "config: split.gamma: missing; split 'maverick' needs it: a number in "
                                             "(0, 1e+06]"),
    ({"name": "adversarial"}, "config: split.gamma: missing; split 'adversarial' needs it: a number in (0, 1e+06]"),
    ({"name": "dirichlet", "alpha": float("nan")}, "config: split.alpha: must be a finite number (got nan)"),
    ({"name": "dirichlet", "alpha": 10**400}, "config: split.alpha: split 'dirichlet' needs a number in (0, 1e+06] "
                                              f"(got {shown(10**400)})"),
    ({"name": "nosuch"}, "config: split: unknown split 'nosuch'; known: " + ", ".join(partition.SPLITS)),
])
def test_the_reported_split_cases_print_these_lines(spec, text):
    """The probe's cases (a raw TypeError before), at validation and at partition time alike."""
    with pytest.raises(ConfigError) as info:
        make_config(dataset="synthetic", split=spec)
    assert one_line(info.value) == text
    import torch

    if not any(isinstance(v, float) and math.isnan(v) for v in spec.values()):  # (a Spec itself refuses NaN)
        with pytest.raises(ConfigError) as info:  # a Spec that never went through a config: the same line
            partition.make_partition(Spec(**spec), 3, 0, torch.zeros(60, 1, 2, 2), torch.arange(60) % 6)
        assert one_line(info.value) == text


def test_a_huge_key_is_echoed_short_everywhere():
    """The probe's 1 MB split-parameter key: at most 80 characters of it, then its length."""
    for data in ({"split": {"name": "dirichlet", "alpha": 0.5, HUGE_KEY: 1}}, {HUGE_KEY: 1},
                 {"method": {"name": "fedavg", HUGE_KEY: 1}}, {"dataset": HUGE_KEY}, {"device": HUGE_KEY}):
        with pytest.raises(ConfigError) as info:
            make_config(data)
        message = one_line(info.value)
        assert "k" * (SHOWN_CHARS + 1) not in message and len(message) < 700, message[:200]
    with pytest.raises(ConfigError) as info:
        make_config(split={"name": "dirichlet", "alpha": 0.5, HUGE_KEY: 1})
    assert one_line(info.value).startswith(f"config: split.{'k' * SHOWN_CHARS}… (length 1000000): split 'dirichlet' "
                                           "has no such parameter; allowed: alpha, min_size, free_riders")


# ------------------------------------------------------------------- the whole schema, then mutated

def _bounds(info) -> dict:
    out = {}
    for item in info.metadata:
        for name in ("ge", "gt", "le", "lt"):
            if getattr(item, name, None) is not None:
                out[name] = getattr(item, name)
    return out


def _field_values(model, name: str) -> st.SearchStrategy:
    """Values of field ``name`` drawn from its type and bounds in the schema (a few fields by meaning)."""
    special = {"dataset": st.sampled_from([d for d in DATASETS if d != "synthetic"] + ["synthetic"] * 3),
               "model": st.sampled_from(list(MODELS)), "device": st.sampled_from(["cpu", "auto", "cuda", "cuda:0"]),
               "data_root": st.none(), "split": split_specs(), "method": st.sampled_from(
                   [{"name": "fedavg"}, {"name": "fedavg_uniform"}, {"name": "fedprox", "mu": 0.01}, "fedavg"]),
               "methods": st.lists(st.sampled_from(SCM_METHODS), max_size=3, unique=True)}
    if name in special:
        return special[name]
    info = model.model_fields[name]
    annotation = info.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = type(None) in typing.get_args(annotation)
    base = args[0] if optional and len(args) == 1 else annotation
    bounds = _bounds(info)
    if typing.get_origin(base) is typing.Literal:
        values = st.sampled_from(typing.get_args(base))
    elif base is bool:
        values = st.booleans()
    elif base is int:
        low = bounds.get("ge", bounds.get("gt", -1) + 1)
        high = min(bounds.get("le", bounds.get("lt", 10**6) - 1), low + 40)
        values = st.one_of(st.integers(low, high), st.just(bounds.get("le", high)))
    elif base is float:
        low, high = bounds.get("ge", bounds.get("gt", 0.0)), bounds.get("le", bounds.get("lt", 1e6))
        values = st.floats(low, high, exclude_min="gt" in bounds, exclude_max="lt" in bounds, allow_nan=False)
    elif typing.get_origin(base) is tuple:
        item = typing.get_args(base)[0]
        values = st.lists(st.integers(1, 30) if item is int else st.floats(0.01, 0.99), max_size=3).map(tuple)
    else:
        raise AssertionError(f"{model.__name__}.{name}: no strategy for {annotation}")
    return st.one_of(st.none(), values) if optional else values


def configs(model) -> st.SearchStrategy:
    """Any subset of the model's fields, each a value of its type within its bounds."""
    return st.fixed_dictionaries({}, optional={name: _field_values(model, name) for name in model.model_fields})


def _deep(levels: int):
    value = 1
    for _ in range(levels):
        value = [value]
    return value


BAD_VALUES = [None, "", "x", "a\x00b", "é" * 5000, HUGE_KEY, [], [1] * 2000, {}, {"a": 1}, True, False,
              float("nan"), float("inf"), -float("inf"), -1, 0, -0.0, 2.5, 10**400, -10**400, 1e308, 2**31, _deep(25)]


@st.composite
def mutated(draw, model) -> tuple[dict, str, str | None]:
    """A schema-drawn config with one thing broken: a field set to a bad value, an unknown or huge key,
    a split parameter dropped, mistyped or unknown. Returns (config data, how it was broken, the text
    its error must hold, or None where the mutation may still be a valid value)."""
    data = dict(draw(configs(model)))
    try:  # a drawn config may be invalid already (clients_per_round > n_clients, ...): then start from none
        model.make(data)
    except ConfigError:
        data = {}
    how = draw(st.sampled_from(["field", "field", "unknown key", "split"] if model is RunConfig
                               else ["field", "field", "unknown key"]))
    if how == "field":
        name = draw(st.sampled_from(list(model.model_fields)))
        data[name] = draw(st.sampled_from(BAD_VALUES))
        return data, name, None
    if how == "unknown key":
        key = draw(st.sampled_from(["learning_rate", "Rounds", "split.alpha", HUGE_KEY, "a\x00b", "", " "]))
        data[key] = draw(st.sampled_from(BAD_VALUES[:4]))
        return data, "unknown key", "unknown key"
    spec = draw(split_specs())
    kind = partition.SPLIT_KINDS[spec["name"]]
    choice = draw(st.sampled_from(["drop", "retype", "unknown"]))
    data["split"] = spec
    if choice == "drop" and kind.required:
        name = draw(st.sampled_from(kind.required))
        spec.pop(name)
        return data, "split", f"split.{name}: "
    if choice == "retype":
        name = draw(st.sampled_from(list(kind.declared)))
        spec[name] = draw(st.sampled_from(BAD_VALUES))
        return data, "split", None
    key = draw(st.sampled_from(["alpha_", HUGE_KEY, "n_mavericks ", "nan"]))
    spec[key] = 1
    return data, "split", f"split.{clipped(key)}: split '{kind.name}' has no such parameter"


@settings(max_examples=80, **SETTINGS)
@given(data=configs(RunConfig))
def test_any_run_config_in_the_schema_validates_or_fails_in_one_line(data):
    config, message = validates_or_refuses(make_config, data)
    if config is not None:  # resolved, keyed, and the same config again from its dict
        assert make_config(config.to_dict()).config_key() == config.config_key()
        assert config.resolved()["split"]["name"] == config.split.name


@settings(max_examples=40, **SETTINGS)
@given(data=configs(ScmConfig))
def test_any_scm_config_in_the_schema_validates_or_fails_in_one_line(data):
    config, _ = validates_or_refuses(ScmConfig.make, data)
    if config is not None:
        assert ScmConfig.make(config.to_dict()).config_key() == config.config_key()


@settings(max_examples=150, **SETTINGS)
@given(case=mutated(RunConfig))
@example(case=({"split": {"name": "dirichlet"}}, "split", "split.alpha: missing; split 'dirichlet'"))  # the probe
@example(case=({"split": {"name": "maverick"}}, "split", "split.n_mavericks: missing; split 'maverick'"))
@example(case=({"split": {"name": "adversarial"}}, "split", "split.gamma: missing; split 'adversarial'"))
@example(case=({"split": {"name": "dirichlet", "alpha": 0.1, HUGE_KEY: 1}}, "split",  # echoed whole before
               f"split.{clipped(HUGE_KEY)}: split 'dirichlet' has no such parameter"))
@example(case=({"device": "cuda:abc"}, "device", "device: must be"))
def test_a_mutated_run_config_validates_or_fails_in_one_line_naming_what_broke(case):
    data, broken, text = case
    config, message = validates_or_refuses(make_config, data)
    if text is not None:  # a mutation that is never valid: refused, naming what broke
        assert config is None and text in message, (text, message)
    elif config is None and broken != "split":  # a bad field value: that field, or one that depends on it, named
        assert broken in message or re.match(r"config: [a-z_.]+: ", message), message


@settings(max_examples=60, **SETTINGS)
@given(case=mutated(ScmConfig))
def test_a_mutated_scm_config_validates_or_fails_in_one_line(case):
    data, broken, text = case
    config, message = validates_or_refuses(ScmConfig.make, data)
    if text is not None:
        assert config is None and text in message, (text, message)


@settings(max_examples=40, **SETTINGS)
@given(value=st.one_of(st.sampled_from([v for v in BAD_VALUES if v is not None and not isinstance(v, dict)]),
                      st.integers(), st.floats(), st.text(max_size=30), st.lists(st.integers(), max_size=3)))
def test_a_config_that_is_not_a_mapping_is_refused_in_one_line(value):
    """(make_config(None) gives the defaults; run(None) is refused, below.)"""
    with pytest.raises(ConfigError) as info:
        make_config(value)
    assert "expected a RunConfig or a mapping" in one_line(info.value)


def test_run_none_is_refused_without_training(monkeypatch):
    """The probe: run(None) trained the 20-round default protocol (10 of its 14 failures)."""
    import sys

    run_module = sys.modules["fedlib.run"]  # (fedlib.run is also the function)
    monkeypatch.setattr(run_module, "prepare", lambda *a, **k: pytest.fail("run(None) started a run"))
    for call in (lambda: fedlib.run(None), lambda: fedlib.run_many([None]), lambda: fedlib.run(None, cache=False)):
        with pytest.raises(ConfigError) as info:
            call()
        assert one_line(info.value).startswith("run: config is None; pass a RunConfig or a mapping of config keys")


@settings(max_examples=40, **SETTINGS)
@given(text=st.one_of(st.sampled_from(["dataset: synthetic\nsplit: {name: dirichlet}\n", "split:\n  name: maverick\n",
                                       "data_root: \"/tmp/a\\0b\"\n", "split: {name: dirichlet, alpha: .nan}\n",
                                       "rounds: 1e999\n", "? [a]\n: 1\n", "device: \"cuda:x\"\n", "{}\n", "- 1\n"]),
                      st.text(max_size=40)))
def test_a_config_file_validates_or_fails_in_one_line(special_paths, text):
    root, _ = special_paths
    path = root / "drawn.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))  # a lone surrogate: bytes that are not UTF-8
    try:
        load_config(path)
    except ConfigError as err:
        one_line(err)


# ------------------------------------------------------------------- a few validated configs run

@settings(max_examples=4, **SETTINGS)
@given(spec=split_specs(kinds=("iid", "dirichlet", "k_classes", "pls", "maverick", "celm_maverick")),
       n_clients=st.integers(3, 5))
def test_a_validated_split_runs_or_fails_in_one_line(spec, n_clients):
    """A handful of one-round runs of a tiny synthetic federation: what validates either runs or stops in
    one line at the split (a count the data cannot give, e.g. more Mavericks than classes)."""
    config, _ = validates_or_refuses(make_config, {"dataset": "synthetic", "n_clients": n_clients, "split": spec,
                                                   "rounds": 1, "test_samples": 50, "batch_size": 64})
    if config is None:
        return
    try:
        result = fedlib.run(config, cache=False, progress=False)
    except ConfigError as err:
        assert one_line(err).startswith("config: ")
        hypothesis.event("stopped at the split")
        return
    hypothesis.event("ran")
    assert len(result.history) == 1 and math.isfinite(result.final["accuracy"])


# ------------------------------------------------------------------- flags shared by the commands

@settings(max_examples=60, **SETTINGS)
@given(value=st.one_of(st.integers(-10**6, 10**6), st.text(max_size=8), st.sampled_from(
    ["70000", "0", "-1", "8866", "65535", "65536", "1", " 80", "8e3", "0x50", True, None, 1.5])))
@example(value="70000")  # the probe
def test_a_port_is_an_integer_in_1_to_65535(value):
    number = value if isinstance(value, int) and not isinstance(value, bool) else (
        int(value) if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,12}\s*", value) else None)
    if number is not None and 1 <= number <= 65535:
        assert check_port(value) == number
    else:
        with pytest.raises(ConfigError) as info:
            check_port(value)
        assert one_line(info.value).startswith("--port: must be an integer in [1, 65535] (got ")


@settings(max_examples=40, **SETTINGS)
@given(value=st.one_of(st.integers(-10, 10**6), st.sampled_from(["4", "0", "x", "1e9", None, 2.0, True])))
def test_a_worker_count_is_an_integer_in_1_to_the_limit(value):
    number = value if isinstance(value, int) and not isinstance(value, bool) else (
        int(value) if isinstance(value, str) and value.isdigit() else None)
    if number is not None and 1 <= number <= MAX_WORKERS:
        assert check_workers(value) == number
    else:
        with pytest.raises(ConfigError) as info:
            check_workers(value, "--jobs")
        assert one_line(info.value).startswith(f"--jobs: must be an integer in [1, {MAX_WORKERS}] (got ")


@settings(max_examples=60, **SETTINGS)
@given(name=st.one_of(st.sampled_from(["cpu", "auto", "cuda", "cuda:0", "cuda:7", "cuda:99", "cuda:255", "cuda:256",
                                       "cuda:00", "cuda:-1", "cuda:", "cuda:x", "tpu", "CPU", " cpu", "", "cpu\x00",
                                       HUGE_KEY, None, 0]),
                      st.from_regex(r"cuda:[0-9]{1,4}", fullmatch=True), st.text(max_size=10)))
@example(name="cuda:99")  # the probe
def test_a_device_is_cpu_auto_cuda_or_cuda_n(name):
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else None
    match = re.fullmatch(r"cpu|auto|cuda(?::(0|[1-9][0-9]{0,2}))?", name) if isinstance(name, str) else None
    good = match is not None and (match.group(1) is None or int(match.group(1)) <= 255)
    if good and count is not None and match.group(1) is not None:
        good = int(match.group(1)) < count
    for check in (check_device, lambda n: make_config(device=n).device):
        if good:
            assert check(name) == name
        else:
            with pytest.raises(ConfigError) as info:
                check(name)
            assert "device" in one_line(info.value)
    if good and name.startswith("cuda") and count is None:  # a command about to run there: CUDA must be here
        with pytest.raises(ConfigError, match="requested but CUDA is not available here"):
            check_device(name, present=True)


@pytest.mark.parametrize("argv, text", [
    (["explore", "--port", "70000"], "fedlib explore: argument --port: must be an integer in [1, 65535] (got '70000') "
                                     "(see fedlib explore --help)"),
    (["explore", "--port", "0"], "fedlib explore: argument --port: must be an integer in [1, 65535] (got '0')"),
    (["explore", "--port", "-5"], "fedlib explore: argument --port: must be an integer in [1, 65535] (got '-5')"),
    (["explore", "--port", "x"], "fedlib explore: argument --port: must be an integer in [1, 65535] (got 'x')"),
    (["book", "--jobs", "100000"], f"fedlib book: argument --jobs: must be an integer in [1, {MAX_WORKERS}] "
                                   "(got '100000')"),
    (["book", "--jobs", "0"], f"fedlib book: argument --jobs: must be an integer in [1, {MAX_WORKERS}] (got '0')"),
    (["nosuch"], "fedlib: argument command: invalid choice: 'nosuch'"),
])
def test_bad_flags_are_refused_in_one_line_before_anything_starts(argv, text, capsys):
    from fedlib.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and err.startswith(text), err


def test_the_run_command_refuses_the_reported_inputs_in_one_line(special_paths, capsys):
    from fedlib.__main__ import main

    root, paths = special_paths
    config = str(root / "ok.yaml")
    for argv, text in [([config, "split.name=dirichlet"], "split.alpha: missing; split 'dirichlet' needs it"),
                       ([config, "split={name: maverick}"], "split.n_mavericks: missing; split 'maverick' needs it"),
                       ([config, f"data_root={paths['loop']}"], "is a loop of symbolic links (refused)"),
                       ([config, "device=cuda:abc"], "device: must be 'cpu', 'cuda', 'cuda:N' or 'auto'"),
                       ([paths["loop"]], "is a loop of symbolic links (refused)"),
                       (["/dev/zero"], "config file /dev/zero is under /dev")]:
        assert main(["run", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("fedlib: ") and err.count("\n") == 1 and text in err, err
