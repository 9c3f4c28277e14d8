"""bf16, the second 16-bit float storage format: numpy interop through ml_dtypes' bfloat16,
conversions rounded to nearest even on both backends (bit for bit against ml_dtypes and against
each other), ops computed in f32 and rounded once, rand below 1 after rounding, and training with
f32 master weights to the accuracy of f32.

The op-by-op storage checks are test_ops.py's test_half_storage; GPU matmul and linear on bf16
operands are test_vulkan_matmul.py's."""

import ml_dtypes
import numpy as np
import pytest

import rlkit.core as rc

from conftest import DEVICES
from test_mixed_precision import train  # tests/ is on sys.path when pytest imports a test module


# ties (to even, both ways), what rounds up across a binade, the largest finite bf16 and what
# rounds past it, subnormals, signed zero, inf and NaN
SPECIAL = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 2 - 2**-9, 3.3895314e38, 3.4e38, -3.4e38,
                    2.0**-133, 2.0**-134, 1e-40, -0.0, 0.0, np.inf, -np.inf, np.nan], np.float32)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view(np.uint16)


@pytest.mark.parametrize("device", DEVICES)
def test_f32_to_bf16_rounds_like_ml_dtypes(device):
    rng = np.random.default_rng(0)
    values = np.concatenate([SPECIAL, (rng.standard_normal(4000) * np.exp(rng.uniform(-88, 88, 4000))).astype(np.float32)])
    x = values.reshape(1, -1)  # one row: an odd element count exercises the GPU's last half word
    expected = x.astype(ml_dtypes.bfloat16)
    got = rc.cast(rc.tensor(x, dtype="f32", device=device), "bf16").numpy()
    assert got.dtype == ml_dtypes.bfloat16
    nan = np.isnan(x)
    np.testing.assert_array_equal(_bits(got)[~nan], _bits(expected)[~nan])
    assert np.isnan(got.astype(np.float32)[nan]).all()
    # and back: bf16 -> f32 is exact
    np.testing.assert_array_equal(rc.cast(rc.tensor(got, device=device), "f32").numpy()[~nan],
                                  expected.astype(np.float32)[~nan])


@pytest.mark.parametrize("device", DEVICES)
def test_conversions_between_f16_bf16_and_i32(device):
    x = np.array([[0.5, -1.25, 3.0, 1000.0, 1e-3]], np.float32)
    b = rc.tensor(x, dtype="bf16", device=device)
    np.testing.assert_array_equal(rc.cast(b, "f16").numpy(), x.astype(ml_dtypes.bfloat16).astype(np.float16))
    h = rc.tensor(x, dtype="f16", device=device)
    np.testing.assert_array_equal(_bits(rc.cast(h, "bf16").numpy()),
                                  _bits(x.astype(np.float16).astype(np.float32).astype(ml_dtypes.bfloat16)))
    np.testing.assert_array_equal(rc.cast(b, "i32").numpy(), [[0, -1, 3, 1000, 0]])


def test_numpy_interop():
    arr = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16))
    t = rc.tensor(arr)  # a bf16 array makes a bf16 tensor
    assert t.dtype == "bf16" and t.numpy().dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(t.numpy().astype(np.float32), arr.astype(np.float32))
    assert rc.tensor([[1.0, 2.0]], dtype="bf16").dtype == "bf16"
    assert rc.param(np.ones((3, 2)), dtype="bf16").requires_grad
    previous = rc.dtype("bf16")
    try:
        assert rc.zeros((2, 2)).dtype == rc.tensor(np.ones((2, 2))).dtype == "bf16"
    finally:
        rc.dtype(previous)
    with pytest.raises(ValueError, match="bf16"):
        rc.dtype("f8")


@pytest.mark.parametrize("device", DEVICES)
def test_ops_on_bf16_match_the_other_backend(device):
    # the CPU result is the reference: the same f32 computation rounded once, bit for bit for
    # elementwise ops; matmul may sum in another order (one bf16 ulp)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((33, 17)), rng.standard_normal((17, 9))
    on = {d: (rc.tensor(a, dtype="bf16", device=d), rc.tensor(b, dtype="bf16", device=d)) for d in ("cpu", device)}
    for fn in (lambda x, y: rc.tanh(x) * 3.0 + x, lambda x, y: rc.softmax(x), lambda x, y: rc.sum(x)):
        got, want = fn(*on[device]).numpy(), fn(*on["cpu"]).numpy()
        np.testing.assert_array_equal(_bits(got), _bits(want))
    got, want = (rc.matmul(*on[d]).numpy().astype(np.float32) for d in (device, "cpu"))
    np.testing.assert_allclose(got, want, rtol=2**-7, atol=1e-2)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
def test_rand_rounded_to_16_bits_stays_below_one(device, dtype):
    rc.manual_seed(3)
    u = rc.rand((1000, 1000), dtype=dtype, device=device).numpy().astype(np.float32)
    assert u.max() < 1.0 and u.min() >= 0.0
    assert u.max() == {"f16": 1 - 2**-11, "bf16": 1 - 2**-8}[dtype]  # a million draws reach the cap


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_with_master_weights_trains_to_the_accuracy_of_f32(device):
    previous = rc.device(device)
    try:
        accuracy32, _, _, _ = train("f32")
        accuracy16, skipped, optimizer, model = train("bf16", master_weights=True)
    finally:
        rc.device(previous)
    assert accuracy32 > 0.9 and abs(accuracy16 - accuracy32) <= 0.02, (accuracy16, accuracy32)
    assert skipped == 0
    for p in model.parameters().values():  # each parameter is its f32 master rounded to bf16
        assert p.dtype == "bf16"
        master = optimizer.master[id(p)].numpy()
        np.testing.assert_array_equal(_bits(p.numpy()), _bits(master.astype(ml_dtypes.bfloat16)))


def test_a_bf16_parameter_needs_master_weights():
    p = rc.param(np.ones((2, 2)), dtype="bf16")
    optimizer = rc.optim.SGD([p], lr=0.1)
    with rc.grad_tape():
        loss = rc.sum(p)
    with pytest.raises(TypeError, match="bf16 parameter .* needs master_weights=True"):
        optimizer.step(rc.backward(loss))


def test_a_checkpoint_keeps_bf16_parameters_and_their_masters(tmp_path):
    from rlkit.checkpoint import load_checkpoint, save_checkpoint
    from rlkit.core import nn

    def model_and_optimizer():
        previous = rc.dtype("bf16")
        try:
            model = nn.Sequential(nn.Linear(4, 8, activation="relu"), nn.Linear(8, 2))
        finally:
            rc.dtype(previous)
        return model, rc.optim.Adam(model.parameters(), lr=0.01, master_weights=True)

    rc.manual_seed(5)
    model, optimizer = model_and_optimizer()
    with rc.grad_tape():
        loss = rc.sum(model(rc.tensor(np.ones((4, 3)), dtype="bf16")))
    optimizer.step(rc.backward(loss))  # the masters now differ from their bf16 roundings
    save_checkpoint(str(tmp_path / "run.safetensors"), {"model": model, "optimizer": optimizer}, step=1)
    rc.manual_seed(6)
    restored, restored_optimizer = model_and_optimizer()
    load_checkpoint(str(tmp_path / "run.safetensors"), {"model": restored, "optimizer": restored_optimizer})
    for (name, p), q in zip(model.parameters().items(), restored.parameters().values()):
        assert q.dtype == "bf16", name
        np.testing.assert_array_equal(_bits(q.numpy()), _bits(p.numpy()))
        np.testing.assert_array_equal(restored_optimizer.master[id(q)].numpy(), optimizer.master[id(p)].numpy())
