"""The same op on NumPy arrays: forward only, on the CPU."""

import kernels as K
import numpy as np
import pytest

import warpbridge as wb


def test_numpy_in_numpy_out():
    op = wb.op(K.vec_mat, num_outputs=2)
    rng = np.random.default_rng(0)
    v, m = rng.normal(size=(5, 3)), rng.normal(size=(5, 3, 3))
    out_v, out_n = op(v, m, 2.0)
    w = np.einsum("nij,nj->ni", m, v)
    assert isinstance(out_v, np.ndarray)
    np.testing.assert_allclose(out_v, 2 * w)
    np.testing.assert_allclose(out_n, (w * v).sum(-1))


def test_numpy_strided_and_function_ops():
    x = np.linspace(0, 1, 12)[::3]
    k = np.arange(4.0)
    np.testing.assert_allclose(wb.op(K.exp_times)(x, k), np.exp(x) * k)
    np.testing.assert_allclose(wb.op(K.mul64)(x, k), np.sin(x) * k)


def test_numpy_dtype_mismatch():
    with pytest.raises(wb.WarpBridgeError, match=r"argument 'x' must have dtype float64, got float32"):
        wb.op(K.mul64)(np.zeros(3, np.float32), np.zeros(3))
