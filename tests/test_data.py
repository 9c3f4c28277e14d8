"""DataLoader: batches are the right columns, every example once per epoch, bad input refused."""

import numpy as np
import pytest

import rlkit.core as rc


def _data(n=10):
    x = np.asfortranarray(np.arange(3 * n, dtype=np.float32).reshape(3, n))
    y = np.arange(n, dtype=np.int64)
    return x, y


def test_epoch_covers_each_example_once_with_matching_targets():
    x, y = _data(10)
    loader = rc.DataLoader(x, y, batch_size=3, shuffle=True, drop_last=False, seed=1)
    assert len(loader) == 4
    seen = []
    for batch in loader.epoch():
        xb, yb = batch.x.numpy(), batch.y.numpy()
        assert batch.y.dtype == "i32" and yb.shape[0] == 1
        np.testing.assert_array_equal(xb, x[:, yb[0]])  # x columns follow their labels
        seen.extend(yb[0].tolist())
    assert sorted(seen) == list(range(10))
    assert seen != list(range(10))  # shuffled


def test_drop_last_and_no_shuffle():
    x, y = _data(10)
    loader = rc.DataLoader(x, y.reshape(1, -1).astype(np.float32), batch_size=4, shuffle=False)
    batches = list(loader.epoch())
    assert len(loader) == len(batches) == 2
    np.testing.assert_array_equal(batches[1].x.numpy(), x[:, 4:8])


def test_reshuffles_every_epoch_and_seed_reproduces():
    x, _ = _data(32)
    a = rc.DataLoader(x, batch_size=32, seed=3)
    b = rc.DataLoader(x, batch_size=32, seed=3)
    first, second = next(a.epoch()).x.numpy(), next(a.epoch()).x.numpy()
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(first, next(b.epoch()).x.numpy())
    assert next(a.epoch()).y is None


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"batch_size": 2.5}, ValueError, "batch_size"),
        ({"batch_size": 11}, ValueError, "exceeds"),
        ({"y": np.zeros(9)}, ValueError, "columns"),
        ({"y": [1, 2]}, TypeError, "y must be"),
    ],
)
def test_bad_input(kwargs, error, message):
    x, _ = _data(10)
    with pytest.raises(error, match=message):
        rc.DataLoader(x, **kwargs)


def test_x_must_be_an_array():
    with pytest.raises(TypeError, match="x must be"):
        rc.DataLoader([[1.0, 2.0]])
    with pytest.raises(ValueError, match="2-D"):
        rc.DataLoader(np.zeros((2, 3, 4)))
