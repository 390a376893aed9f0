import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from fedlib.layers import MaskedBatchNorm, sample_mask
from fedlib.models import MODELS, FedModel, build_model

TYPICAL_SHAPES = [
    ("mlp", (1, 28, 28), 64),
    ("cnn", (3, 32, 32), 84),
    ("lenet5", (1, 28, 28), 84),
    ("lenet5", (3, 32, 32), 84),
    ("cnn_wide", (3, 32, 32), 128),
    ("resnet20", (3, 32, 32), 64),
    ("vgg11", (3, 32, 32), 512),
    ("resnet18", (3, 32, 32), 512),
]
BIG_MODELS = ("vgg11", "resnet18")


def typical_shape(name):
    return next(shape for model, shape, _ in TYPICAL_SHAPES if model == name)


def batch_size(name):
    return 2 if name in BIG_MODELS else 4


def num_parameters(model):
    return sum(p.numel() for p in model.parameters())


def build_copies(name, shape, count, train):
    """``count`` independently initialised copies and a meta-device skeleton to call."""
    models = [build_model(name, shape, 10).train(train) for _ in range(count)]
    skeleton = copy.deepcopy(models[0]).to("meta")
    return models, skeleton


def test_models_tuple():
    assert MODELS == ("mlp", "cnn", "lenet5", "cnn_wide", "resnet20", "vgg11", "resnet18")


@pytest.mark.parametrize("num_classes, expected", [(10, 272_474), (100, 278_324)])
def test_resnet20_parameter_count(num_classes, expected):
    assert num_parameters(build_model("resnet20", (3, 32, 32), num_classes)) == expected


def test_resnet20_zero_pad_shortcut_is_parameter_free():
    model = build_model("resnet20", (3, 32, 32), 10, shortcut="zero_pad")
    assert num_parameters(model) == 272_474 - 2_752  # minus the two 1x1 conv + BN projections
    copies = [model, build_model("resnet20", (3, 32, 32), 10, shortcut="zero_pad")]
    params, buffers = stack_module_state(copies)
    skeleton = copy.deepcopy(model).to("meta")
    x = torch.randn(2, 3, 32, 32)
    batched = vmap(lambda p, b: functional_call(skeleton, (p, b), (x,)))(params, buffers)
    with torch.no_grad():
        for index, single in enumerate(copies):
            torch.testing.assert_close(batched[index], single(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "name, shape, expected",
    [
        ("mlp", (1, 28, 28), 242_762),
        ("cnn", (3, 32, 32), 121_182),
        ("lenet5", (1, 28, 28), 61_706),
        ("lenet5", (3, 32, 32), 62_006),
        ("vgg11", (3, 32, 32), 9_231_114),
        ("resnet18", (3, 32, 32), 11_173_962),
    ],
)
def test_parameter_counts(name, shape, expected):
    assert num_parameters(build_model(name, shape, 10)) == expected


@pytest.mark.parametrize("name, shape, feature_dim", TYPICAL_SHAPES)
def test_shapes_features_and_head(name, shape, feature_dim):
    torch.manual_seed(0)
    model = build_model(name, shape, 7).eval()
    x = torch.randn(batch_size(name), *shape)
    assert isinstance(model, FedModel) and isinstance(model.head, nn.Linear)
    assert model.feature_dim == feature_dim
    logits, features = model(x, return_features=True)
    assert logits.shape == (len(x), 7)
    assert features.shape == (len(x), feature_dim)
    torch.testing.assert_close(logits, model.head(features))
    torch.testing.assert_close(model(x), logits)
    torch.testing.assert_close(model.features(x), features)
    assert model.head_parameter_names() == ["head.weight", "head.bias"]
    assert set(model.head_parameter_names()) <= dict(model.named_parameters()).keys()


@pytest.mark.parametrize("name", MODELS)
def test_layers_are_vmap_friendly(name):
    model = build_model(name, typical_shape(name), 10)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            assert type(module) is MaskedBatchNorm and module.momentum == 0.1
        assert not isinstance(module, nn.modules.dropout._DropoutNd)
        assert not getattr(module, "inplace", False)


@pytest.mark.parametrize("name", ("mlp", "cnn", "lenet5", "resnet20"))
def test_init_is_deterministic(name):
    states = []
    for _ in range(2):
        torch.manual_seed(3)
        states.append(build_model(name, typical_shape(name), 10).state_dict())
    for key, value in states[0].items():
        assert torch.equal(value, states[1][key]), key


@pytest.mark.parametrize("name", MODELS)
def test_vmap_matches_per_model_eval(name):
    torch.manual_seed(0)
    models, skeleton = build_copies(name, typical_shape(name), 3, train=False)
    for model in models:  # non-trivial running statistics
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith("running_mean") or buffer_name.endswith("running_var"):
                buffer.copy_(torch.rand_like(buffer) + 0.5)
    params, buffers = stack_module_state(models)
    x = torch.randn(batch_size(name), *typical_shape(name))
    batched = vmap(lambda p, b: functional_call(skeleton, (p, b), (x,)))(params, buffers)
    with torch.no_grad():
        for index, model in enumerate(models):
            torch.testing.assert_close(batched[index], model(x), atol=1e-5, rtol=1e-4)


def test_vmap_matches_per_model_train_resnet20():
    torch.manual_seed(0)
    models, skeleton = build_copies("resnet20", (3, 32, 32), 3, train=True)
    params, buffers = stack_module_state(models)
    x = torch.randn(3, 4, 3, 32, 32)  # a different batch per copy
    batched = vmap(lambda p, b, xb: functional_call(skeleton, (p, b), (xb,)))(params, buffers, x)
    with torch.no_grad():
        for index, model in enumerate(models):
            torch.testing.assert_close(batched[index], model(x[index]), atol=1e-5, rtol=1e-4)
            for buffer_name, buffer in model.named_buffers():
                updated = buffers[buffer_name][index]
                torch.testing.assert_close(updated, buffer, atol=1e-5, rtol=1e-4)
    assert models[0].stem_bn.num_batches_tracked.item() == 1


def test_vmap_grad_with_mask_matches_per_model_train_resnet20():
    """The engine's pattern: vmap(grad(loss)) over copies, padded batches, BN in training.

    float64: in float32 a pre-activation within ~1e-7 of a ReLU kink can flip sides
    between two equally valid computations and change the gradient visibly.
    """
    torch.manual_seed(0)
    models, skeleton = build_copies("resnet20", (3, 32, 32), 2, train=True)
    models = [model.double() for model in models]
    skeleton = skeleton.double()
    params, buffers = stack_module_state(models)
    x = torch.randn(2, 5, 3, 32, 32, dtype=torch.float64)
    y = torch.randint(0, 10, (2, 5))
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)

    def masked_loss(p, b, xb, yb):
        with sample_mask(mask):
            logits = functional_call(skeleton, (p, b), (xb,))
        losses = nn.functional.cross_entropy(logits, yb, reduction="none")
        return (losses * mask).sum() / mask.sum()

    grads = vmap(grad(masked_loss))(params, buffers, x, y)
    for index, model in enumerate(models):
        loss = nn.functional.cross_entropy(model(x[index, :3]), y[index, :3])
        expected = torch.autograd.grad(loss, list(model.parameters()))
        for (param_name, _), expected_grad in zip(model.named_parameters(), expected):
            batched_grad = grads[param_name][index]
            torch.testing.assert_close(batched_grad, expected_grad, atol=1e-10, rtol=1e-8)
        for buffer_name, buffer in model.named_buffers():
            torch.testing.assert_close(buffers[buffer_name][index], buffer, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("name", ("resnet20", "vgg11"))
def test_padded_batch_with_mask_matches_unpadded(name):
    torch.manual_seed(0)
    padded_model = build_model(name, (3, 32, 32), 10).train()
    plain_model = copy.deepcopy(padded_model)
    real = torch.randn(3, 3, 32, 32)
    junk = 100 * torch.randn(2, 3, 32, 32)
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])
    with torch.no_grad():
        with sample_mask(mask):
            padded_out = padded_model(torch.cat([real, junk]))
        plain_out = plain_model(real)
    torch.testing.assert_close(padded_out[:3], plain_out, atol=1e-5, rtol=1e-4)
    for (buffer_name, padded), plain in zip(padded_model.named_buffers(), plain_model.buffers()):
        torch.testing.assert_close(padded, plain, atol=1e-5, rtol=1e-4, msg=buffer_name)


def assert_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as error:
        call()
    assert "\n" not in str(error.value)


def test_unknown_name_lists_models():
    assert_one_line_value_error(lambda: build_model("resnet50", (3, 32, 32), 10), "resnet20")


@pytest.mark.parametrize(
    "name, shape",
    [
        ("lenet5", (3, 30, 30)),
        ("vgg11", (3, 28, 28)),
        ("cnn", (3, 12, 12)),
        ("mlp", (28, 28)),
        ("resnet20", (3, 0, 32)),
    ],
)
def test_bad_input_shape(name, shape):
    assert_one_line_value_error(lambda: build_model(name, shape, 10), r"\d")


def test_bad_shortcut_and_num_classes():
    assert_one_line_value_error(
        lambda: build_model("resnet20", (3, 32, 32), 10, shortcut="B"), "shortcut"
    )
    assert_one_line_value_error(lambda: build_model("mlp", (1, 28, 28), 0), "num_classes")


def test_the_wide_cnn_has_the_widths_it_states():
    """cnn_wide (a reading of the papers' "5-layer CNN", issue 30): five weight layers of the stated widths;
    its parameter count derived by hand: conv 3*32*25 + 32, 32*64*25 + 64; FC 1600*512 + 512,
    512*128 + 128, head 128*10 + 10."""
    model = build_model("cnn_wide", (3, 32, 32), 10)
    expected = (3 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (1600 * 512 + 512) + (512 * 128 + 128) + (128 * 10 + 10)
    assert sum(p.numel() for p in model.parameters()) == expected == 940_362
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10) and model.feature_dim == 128
    with pytest.raises(ValueError, match="cnn_wide needs inputs of at least 14x14"):
        build_model("cnn_wide", (3, 12, 12), 10)
