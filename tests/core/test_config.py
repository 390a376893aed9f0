"""Config validation: one-line errors naming the field, safe YAML, stable hashing."""

import pytest

from fedlib.config import ConfigError, RunConfig, load_config, make_config

BAD = [
    ({"rounds": 0}, "rounds"),
    ({"lr": 0}, "lr"),
    ({"lr": -1.0}, "lr"),
    ({"n_clients": 0}, "n_clients"),
    ({"n_clients": 5, "clients_per_round": 6}, "clients_per_round"),
    ({"batch_size": 0}, "batch_size"),
    ({"local_epochs": 0}, "local_epochs"),
    ({"fraction": 0}, "fraction"),
    ({"fraction": 1.5}, "fraction"),
    ({"momentum": 1.0}, "momentum"),
    ({"weight_decay": -0.1}, "weight_decay"),
    ({"device": "tpu"}, "device"),
    ({"lr_milestones": [0]}, "lr_milestones"),
    ({"rounds": "many"}, "rounds"),
    ({"learning_rate": 0.1}, "learning_rate"),
    ({"split": {"name": "dirichlet", "alpha": 0}}, "split.alpha"),
    ({"split": {"name": "dirichlet", "alpha": -1}}, "split.alpha"),
    ({"split": {"name": "maverick", "gamma": 0}}, "split.gamma"),
    ({"split": {"name": "k_classes", "k": 11}}, "split.k"),
    ({"split": {"name": "k_classes", "k": 0}}, "split.k"),
    ({"method": {"name": "fedmagic"}}, "fedmagic"),
    ({"method": {"name": "fedprox", "mux": 1}}, "mux"),
    ({"method": {"name": "fedprox", "mu": -1}}, "mu"),
    ({"method": {"name": "fedprox", "mu": "big"}}, "mu"),
]


@pytest.mark.parametrize("overrides,field", BAD, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD)])
def test_bad_values_give_one_line_errors_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        make_config(overrides)
    message = str(info.value)
    assert "\n" not in message
    assert field in message


def test_range_is_named():
    with pytest.raises(ConfigError, match="greater than 0"):
        make_config(lr=-1)
    with pytest.raises(ConfigError, match="must be <= n_clients = 5"):
        make_config(n_clients=5, clients_per_round=9)


def test_defaults_and_schedule():
    cfg = make_config(lr=0.1, lr_milestones=[50], rounds=100)
    assert cfg.per_round == cfg.n_clients == 5
    assert cfg.lr_at(0) == 0.1 and cfg.lr_at(49) == 0.1
    assert cfg.lr_at(50) == pytest.approx(0.01)


def test_key_ignores_data_root_but_not_results_fields():
    a = make_config(rounds=3, dataset="synthetic")
    assert a.key() == make_config(rounds=3, dataset="synthetic", data_root="/elsewhere").key()
    assert a.key() != make_config(rounds=3, dataset="synthetic", client_chunk=4).key()  # chunking changes numbers
    assert a.key() != make_config(rounds=4, dataset="synthetic").key()
    assert a.key() != make_config(rounds=3, dataset="synthetic", method={"name": "fedprox", "mu": 0.1}).key()
    # a default written out is the same run as the default left out (the key hashes the resolved config)
    assert make_config(method="fedprox").key() == make_config(method={"name": "fedprox", "mu": 0.01}).key()


def test_method_and_split_accept_short_form():
    cfg = make_config(method="fedavg_uniform", split="iid")
    assert cfg.method.name == "fedavg_uniform" and cfg.split.params == {}


def test_yaml_is_loaded_safely_and_malformed_yaml_is_one_line(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("rounds: 3\nsplit: {name: dirichlet, alpha: 0.5}\n")
    cfg = load_config(good)
    assert isinstance(cfg, RunConfig) and cfg.split.params == {"alpha": 0.5}
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [3\nlr: 0.1\n")
    with pytest.raises(ConfigError, match=r"malformed YAML at line \d+") as info:
        load_config(bad)
    assert "\n" not in str(info.value)
    evil = tmp_path / "evil.yaml"
    evil.write_text("rounds: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_config(evil)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(listy)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")


def test_augmentation_off_keeps_every_earlier_key_and_on_changes_it():
    from fedlib.config import RunConfig, make_config

    plain = make_config({"dataset": "synthetic", "model": "mlp"})
    assert "augment" not in plain.resolved() and plain.augment is None
    on = make_config({"dataset": "synthetic", "model": "mlp", "augment": "crop_flip"})
    assert on.resolved()["augment"] == "crop_flip" and on.config_key() != plain.config_key()
    with pytest.raises(ValueError, match="augment"):
        RunConfig.make({"augment": "mixup"})
