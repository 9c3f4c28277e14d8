"""float(), int() and bool() of one-element tensors, as PyTorch's, and the layout hint of the
errors for a row-major batch given where rlkit's column-major [features, batch] is expected."""

import numpy as np
import pytest

import rlkit.core as rc


@pytest.mark.parametrize("value, dtype", [(2.75, "f32"), (-3.0, "f32"), (7, "i32"), (0.0, "f32")])
def test_one_element_tensors_convert_as_python_numbers(value, dtype):
    t = rc.tensor(np.array([[value]]), dtype=dtype)
    assert float(t) == float(value) and isinstance(float(t), float)
    assert int(t) == int(value) and isinstance(int(t), int)
    assert bool(t) is bool(value)


def test_a_reduced_loss_converts_with_float():
    x = rc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert float(rc.sum(x)) == 15.0
    assert float(rc.mean(x)) == pytest.approx(2.5)


@pytest.mark.parametrize("conversion", [float, int, bool])
def test_more_than_one_element_is_refused_as_pytorch_does(conversion):
    t = rc.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=rf"^{conversion.__name__}\(\) of a tensor needs exactly one element, "
                                         r"this one has 6 \(shape \(2, 3\)\)"):
        conversion(t)


def test_a_row_major_batch_into_a_linear_layer_says_to_transpose_it():
    layer = rc.nn.Linear(2, 3)
    batch = np.random.default_rng(0).standard_normal((100, 2)).astype(np.float32)  # (batch, features)
    with pytest.raises(ValueError, match=r"Linear: input has 100 features \(rows\), expected 2; shape \(100, 2\); "
                                         r".*transpose it \(x\.T\) to get \[2, 100\]"):
        layer(rc.tensor(batch))
    assert layer(rc.tensor(batch.T)).shape == (3, 100)  # the hint's fix works


def test_a_wrong_height_that_no_transpose_fixes_gets_no_hint():
    with pytest.raises(ValueError) as raised:
        rc.nn.Linear(2, 3)(rc.tensor(np.zeros((5, 7), np.float32)))
    assert "transpose" not in str(raised.value)


def test_a_row_major_matmul_operand_says_to_transpose_it():
    w = rc.tensor(np.ones((3, 2), np.float32))  # [out, in]
    batch = np.ones((100, 2), np.float32)
    with pytest.raises(ValueError, match=r"inner dimensions differ.*transpose it \(b\.T\) to get \[2, 100\]"):
        rc.matmul(w, rc.tensor(batch))
    with pytest.raises(ValueError) as raised:
        rc.matmul(w, rc.tensor(np.ones((5, 7), np.float32)))
    assert "transpose" not in str(raised.value)
    np.testing.assert_array_equal((w @ rc.tensor(batch.T)).numpy(), np.full((3, 100), 2.0))
