"""State-space layer ops beyond the op table's cases: ssm_conv's shape errors, and its conv
state carried between chunks of a sequence giving the same outputs as the whole sequence (how
Mamba runs step by step), on both backends."""

import numpy as np
import pytest

import rlkit.core as rc


def test_ssm_conv_chunks_with_carried_state_match_the_whole_sequence(device):
    rng = np.random.default_rng(0)
    d_conv, d_inner, n_t, n_s = 4, 8, 12, 3
    x = rng.standard_normal((n_t, d_inner, n_s)).astype(np.float32)  # the sequence, time along dim 0
    c = rc.tensor(rng.standard_normal((d_conv, d_inner)).astype(np.float32))
    state = np.zeros((d_conv - 1, d_inner, n_s), np.float32)  # a fresh sequence starts from zeros
    whole = rc.ssm_conv(rc.tensor(np.concatenate([state, x])), c).numpy()  # [d_inner, n_t, n_s]
    pieces = []
    for chunk in (x[:5], x[5:6], x[6:]):  # 5 steps, 1 step, 6 steps
        sx = np.concatenate([state, chunk])
        pieces.append(rc.ssm_conv(rc.tensor(sx), c).numpy())
        state = sx[-(d_conv - 1):]  # the new conv state: the last d_conv - 1 steps
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sx_shape, c_shape, message", [
    ((6, 4, 2), (3, 5), "c .* has d_inner 5 but sx .* has 4"),
    ((2, 4, 2), (3, 4), "sx has 2 steps along dim 0, fewer than d_conv = 3"),
    ((6, 4, 2, 2), (3, 4), "sx must have at most 3 dimensions"),
    ((6, 4, 2), (3, 4, 2), "c must be 2-D"),
])
def test_ssm_conv_refuses_bad_shapes(device, sx_shape, c_shape, message):
    with pytest.raises(ValueError, match=message):
        rc.ssm_conv(rc.tensor(np.zeros(sx_shape, np.float32)), rc.tensor(np.zeros(c_shape, np.float32)))
    with pytest.raises(TypeError, match="dtypes differ"):
        rc.ssm_conv(rc.tensor(np.zeros((6, 4, 2), np.float32)), rc.tensor(np.zeros((3, 4)), dtype="f64"))
