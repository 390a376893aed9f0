"""Reliability: bad inputs give one short line naming what is wrong: config values, YAML files and
command-line overrides, the API's argument, the queue's flags and the chapters' papermill parameters
(issues 15, 33)."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
from reliability_common import ROOT, TINY, _one_line_err

import fedlib
from fedlib.__main__ import main as cli
from fedlib.app.kit.sources import load_profile
from fedlib.config import ConfigError, load_config, make_config


def _laughs(levels: int = 6) -> str:
    lines = ['a0: &a0 "lol"']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines)


def test_15_3_yaml_aliases_and_self_expanding_values_are_refused(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text("split:\n  name: iid\n  extra:\n" + "\n".join("    " + line for line in _laughs().splitlines())
                    + "\n")
    with pytest.raises(ConfigError, match="alias") as info:
        load_config(path)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300
    shared = ["lol"] * 9
    for _ in range(6):
        shared = [shared] * 9  # 9^7 values if expanded
    with pytest.raises(ConfigError, match="more than 1000 values"):
        make_config(split={"name": "iid", "extra": shared})


# BAD_INPUTS lists every bad config input tried (file, override and API paths): each must give
# one ConfigError line naming the field, echoing at most a short piece of the value.
BAD_INPUTS = [  # (config data, field named in the one-line error)
    ({"model": "resnet9000"}, "model"),
    ({"split": {"name": "dirichlet", "alpha": "abc"}}, "split.alpha"),
    ({"seed": 1e23}, "seed"),
    ({"rounds": 1e30}, "rounds"),
    ({"dataset": "imagefolder:"}, "dataset"),
    ({"batch_size": 1e10}, "batch_size"),
    ({"lr": float("inf")}, "lr"),
    ({"lr": float("nan")}, "lr"),
    ({"rounds": True}, "rounds"),
    ({"n_clients": False}, "n_clients"),
    ({"split": {"name": "iid", "nan_updates": -1}}, "split.nan_updates"),
    ({"split": {"name": "iid", "huge_updates": -2}}, "split.huge_updates"),
    ({"split": {"name": "iid", "huge_updates": 1.5}}, "split.huge_updates"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**40}, "seed"),
    ({"n_clients": 10**9}, "n_clients"),
    ({"local_epochs": 10**6}, "local_epochs"),
    ({"lr_milestones": [True]}, "lr_milestones"),
    ({"lr_milestones": list(range(1, 5000))}, "lr_milestones"),
    ({"device": "x" * 50_000_000}, "device"),
    ({"data_root": "y" * 50_000_000}, "data_root"),
    ({"method": {"name": "fedprox", "mu": float("inf")}}, "mu"),
    ({"split": {"name": "dirichlet", "alpha": float("nan")}}, "alpha"),
    ({"split": {"name": "iid", "extra": list(range(5000))}}, "extra"),
    ({"test_samples": 10**12}, "test_samples"),
]


@pytest.mark.parametrize("data,field", BAD_INPUTS, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD_INPUTS)])
def test_15_8_and_9_bad_values_give_one_short_line_naming_the_field(data, field):
    with pytest.raises(ConfigError) as info:
        make_config(data)
    message = str(info.value)
    assert "\n" not in message and field in message and len(message) < 400


@pytest.mark.parametrize("value", ["file.yaml", Path("file.yaml"), ["rounds", 2], 5, b"rounds: 2"])
def test_15_8_the_api_takes_configs_only_and_says_so_in_one_line(value):
    with pytest.raises(ConfigError, match="expected a RunConfig or a mapping") as info:
        fedlib.run(value, cache=False, progress=False)
    assert "\n" not in str(info.value)


BAD_FILES = [  # (file content, text in the error)
    (b"rounds: 3\nlr: \xff\xfe\n", "not UTF-8"),
    (b"", "empty config file"),
    (b"# only a comment\n", "empty config file"),
    (b"lr_milestones: [" + b"1, " * 150_000 + b"1]\n", "too large"),
    (b"rounds: &r 3\nlocal_epochs: *r\n", "alias"),
    (b"split: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply|too large|malformed"),
    (b"rounds: [3\n", "malformed YAML"),
    (b"- rounds\n", "expected a mapping"),
    (b"seed: 1.0e+23\n", "seed"),
    (b"rounds: 1.0e+30\n", "rounds"),
    (b"batch_size: 1.0e+10\n", "batch_size"),
    (b"split: {name: dirichlet, alpha: abc}\n", "split.alpha"),
    (b"dataset: 'imagefolder:'\n", "dataset"),
    (b"model: nope\n", "model"),
    (b"lr: .inf\n", "lr"),
    (b"rounds: true\n", "rounds"),
]


@pytest.mark.parametrize("content,text", BAD_FILES, ids=[f"file-{i}" for i in range(len(BAD_FILES))])
def test_15_8_and_9_bad_config_files_give_one_line(tmp_path, content, text):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=text) as info:
        load_config(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert time.perf_counter() - t0 < 5


BAD_OVERRIDES = [["rounds=[1"], ["=3"], ["rounds"], ["split.=2"], ["rounds=*a"], ["lr=.inf"], ["rounds=true"],
                 ["model=nope"]]


@pytest.mark.parametrize("tokens", BAD_OVERRIDES, ids=[t[0] for t in BAD_OVERRIDES])
def test_15_8_malformed_overrides_give_one_line_and_status_2(tmp_path, capsys, tokens):
    from fedlib.__main__ import main

    path = tmp_path / "base.yaml"
    path.write_text("dataset: synthetic\nrounds: 1\n")
    assert main(["run", str(path), *tokens]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedlib: ") and "\n" not in err and "Traceback" not in err


def test_15_12_overrides_may_follow_flags(tmp_path):
    from fedlib.__main__ import main

    path = tmp_path / "base.yaml"
    path.write_text("dataset: synthetic\nn_clients: 3\nrounds: 4\nbatch_size: 32\nfraction: 0.1\n"
                    "split: {name: dirichlet, alpha: 0.5}\n")
    out = tmp_path / "r.json"
    assert main(["run", str(path), "--no-cache", "rounds=1", "--json", str(out), "split.alpha=0.3"]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["rounds"] == 1 and result["config"]["split"] == {"name": "dirichlet", "alpha": 0.3}


def _deep(levels: int):
    value = 1
    for _ in range(levels):
        value = [value]
    return value


EXTREME_CONFIGS = [  # (config data, text of the one-line error)
    ({"lr": 1e308}, "lr"),
    ({"weight_decay": 1e308}, "weight_decay"),
    ({"lr": 1e7}, "lr"),
    ({"x" * 1_000_000: 1}, "unknown key"),
    ({"split": {"name": "iid", "a": _deep(900)}}, "nested"),
    ({"rounds": np.bool_(True)}, "numpy boolean"),
    ({"lr_milestones": [np.bool_(True)]}, "numpy boolean"),
]


@pytest.mark.parametrize("data,text", EXTREME_CONFIGS, ids=[f"extreme-{i}" for i in range(len(EXTREME_CONFIGS))])
def test_33_8_config_extremes_give_one_short_config_error(data, text):
    with pytest.raises(ConfigError) as info:
        make_config(data)
    message = str(info.value)
    assert type(info.value) is ConfigError and "\n" not in message and text in message and len(message) < 400


def test_33_8_fedscm_rates_are_bounded_and_minus_zero_is_zero():
    from fedlib.config import ScmConfig

    with pytest.raises(ConfigError, match="lr"):
        ScmConfig.make({"lr": 1e308})
    assert make_config(TINY, momentum=-0.0).key() == make_config(TINY, momentum=0.0).key()
    plain = make_config(TINY, split={"name": "iid", "covariate_shift": 0.0})
    assert make_config(TINY, split={"name": "iid", "covariate_shift": -0.0}).key() == plain.key()
    assert make_config(TINY, momentum=-0.0).to_dict()["momentum"] == 0.0
    assert str(make_config(TINY, momentum=-0.0).momentum) == "0.0"


@pytest.mark.parametrize("cache", ["no", 1, None, "False"])
def test_33_8_cache_takes_only_booleans_or_a_store(cache):
    from fedlib.config import ScmConfig
    from fedlib.scm_pipeline import run_pipeline

    with pytest.raises(ConfigError, match="cache: must be True, False or a fedlib.cache.ResultCache"):
        fedlib.run(make_config(TINY), cache=cache, progress=False)
    with pytest.raises(ConfigError, match="cache: must be True, False or a fedlib.cache.ResultCache"):
        run_pipeline(ScmConfig.make({"dataset": "synthetic", "n_clients": 12}), cache=cache)


BAD_PARAMETERS = [  # (papermill values over the quick profile, text of the one line)
    ({"roundz": 1}, "unknown parameter 'roundz'"),
    ({"profile": "nosuch"}, "unknown profile 'nosuch'; known: evidence, paper, quick, smoke"),
    ({"seeds": 5}, "parameter seeds: Input should be a valid list (got 5)"),
    ({"seeds": []}, "parameter seeds: List should have at least 1 item after validation, not 0 (got [])"),
    ({"seeds": ["a"]}, "parameter seeds.0: Input should be a valid integer (got 'a')"),
    ({"rounds": "10"}, "parameter rounds: Input should be a valid integer (got '10')"),
    ({"rounds": 10.0}, "parameter rounds: Input should be a valid integer (got 10.0)"),
    ({"cffl_study": {"split": "PLS"}}, "missing parameter 'cffl_study.fraction'"),
]


@pytest.mark.parametrize("values,text", BAD_PARAMETERS, ids=[f"param-{i}" for i in range(len(BAD_PARAMETERS))])
def test_33_9_chapters_check_their_papermill_parameters(values, text):
    from fedlib.app.chapters.base import ChapterParameterError, check_parameters

    namespace = {**load_profile("celm", "quick"), "profile": "quick", **values}
    with pytest.raises(ChapterParameterError) as info:
        check_parameters("celm", namespace)
    assert str(info.value).startswith(f"celm: {text}") and "\n" not in str(info.value)


def test_33_9_imported_constants_are_not_parameters():
    """A chapter's own constants imported into the notebook (``from ... import TABLE4_FORMAT``) pass;
    the same value under a lower-case name is an unknown parameter."""
    from fedlib.app.chapters.base import ChapterParameterError, check_parameters

    namespace = {**load_profile("flce", "smoke"), "profile": "smoke", "TABLE4_FORMAT": {"a": "{:.2f}"}}
    check_parameters("flce", namespace)
    namespace["table4_format"] = namespace.pop("TABLE4_FORMAT")
    with pytest.raises(ChapterParameterError, match="flce: unknown parameter 'table4_format'"):
        check_parameters("flce", namespace)


def test_33_9_every_chapter_checks_first_and_its_own_profiles_pass():
    from fedlib.app.chapters.base import (
        check_parameters,
        notebook_defaults,
        profiles_of,
    )

    chapters = sorted(p.name for p in (ROOT / "params").iterdir() if p.is_dir())
    for chapter in chapters:
        cells = json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text())["cells"]
        tagged = next(i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", []))
        first = next(c for c in cells[tagged + 1:] if c["cell_type"] == "code")
        assert f"check_parameters({chapter!r}, globals())" in "".join(first["source"]), chapter
        for profile in profiles_of(chapter):  # no false alarm on any profile or the notebook's own defaults
            check_parameters(chapter, {**notebook_defaults(chapter), **load_profile(chapter, profile),
                                       "profile": profile})
        check_parameters(chapter, notebook_defaults(chapter))


BAD_FLAGS = [  # (flags, flag named in the one line)
    (["--budget", "-5"], "--budget"),
    (["--budget", "nan"], "--budget"),
    (["--budget", "inf"], "--budget"),
    (["--limit", "-8"], "--limit"),
    (["--limit", "0"], "--limit"),
    (["--first", "nosuch"], "--first"),
    (["--first", "fedavg:No such table"], "--first"),
    (["--table", "No such table"], "--table"),
    (["--dataset", "nosuch"], "--dataset"),
    (["--device", "tpu"], "--device"),
    (["--seed", "-1"], "--seed"),
]


@pytest.mark.parametrize("flags,flag", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_33_10_queue_flags_are_validated_in_one_line(flags, flag, capsys):
    assert cli(["results", "--list", "--summary", "--only", "fedavg", *flags]) == 2
    assert flag in _one_line_err(capsys, "fedlib results: ")
