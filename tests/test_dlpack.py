"""Any array producer through the same op: DLPack and __cuda_array_interface__ arrays and
wp.array, forward only. On the CPU the producer is a minimal class that speaks only DLPack
(over NumPy memory, the way a foreign library would hand arrays over); CuPy and CUDA
producers are tested under the `gpu` marker."""

import kernels as K
import numpy as np
import pytest
import torch
import warp as wp

import warpbridge as wb


class Producer:
    """An array from "some library": nothing but the DLPack protocol (and a flag to ask for
    gradients, as autograd libraries spell it)."""

    def __init__(self, a, device=None, requires_grad=False):
        self._a = a
        self._device = device
        self.requires_grad = requires_grad

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device or self._a.__dlpack_device__()


class CudaOnly:
    """An object with only __cuda_array_interface__ (Numba's device arrays look like this)."""

    def __init__(self, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f8", "data": (0, False), "version": 3}


def rand(*shape):
    return np.random.default_rng(0).random(shape)


def test_a_dlpack_producer_gives_numpy_outputs_equal_to_the_numpy_path():
    op = wb.op(K.mul64, name="dl_mul")
    x, y = rand(7), rand(7) + 1
    x0 = x.copy()
    out = op(Producer(x), Producer(y))
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_array_equal(out, op(x, y))
    np.testing.assert_allclose(out, np.sin(x) * y, rtol=1e-15)
    np.testing.assert_array_equal(x, x0)  # the input is only read


def test_inputs_are_shared_without_a_copy():
    seen = []

    def record(x: wp.array(dtype=wp.float64), k: wp.array(dtype=wp.float64), z: wp.array(dtype=wp.float64)):
        seen.append((x.ptr, k.ptr))
        K.exp_times(x, k, z)

    op = wb.op(record, name="dl_record")
    x, k = rand(5), rand(5)
    op(Producer(x), Producer(k))  # a plan's first run is on copies (it checks no input is written)
    out = op(Producer(x), Producer(k))
    assert seen[0] != (x.ctypes.data, k.ctypes.data) and seen[1] == (x.ctypes.data, k.ctypes.data)
    np.testing.assert_allclose(out, np.exp(x) * k)


def test_strided_vector_inputs_scalars_and_several_outputs():
    op = wb.op(K.vec_mat, num_outputs=2, name="dl_vec_mat")
    v = rand(10, 3)[::2]  # outer stride of two rows
    m = rand(5, 3, 3)
    out_v, out_n = op(Producer(v), Producer(m), 0.5)
    w = np.einsum("nij,nj->ni", m, v)
    np.testing.assert_allclose(out_v, 0.5 * w)
    np.testing.assert_allclose(out_n, (w * v).sum(-1))
    assert out_v.shape == (5, 3)


def test_wp_arrays_in_wp_arrays_out():
    op = wb.op(K.add_vec3, name="dl_add_vec3")
    a = wp.array(rand(4, 3).astype(np.float32), dtype=wp.vec3)
    b = wp.array(np.ones((4, 3), np.float32))  # a plain (4, 3) float32 array works as vec3 too
    out = op(a, b)
    assert isinstance(out, wp.array) and out.shape == (4, 3)
    np.testing.assert_allclose(out.numpy(), a.numpy() + 1)


def test_gradients_requested_through_dlpack_are_refused_with_the_fix():
    op = wb.op(K.mul64, name="dl_mul_grad")
    x = rand(3)
    with pytest.raises(
        wb.WarpBridgeError, match=r"dl_mul_grad\(\): argument 'y' requires gradients.*torch.from_dlpack"
    ):
        op(Producer(x), Producer(x, requires_grad=True))
    w = wp.array(x, dtype=wp.float64, requires_grad=True)
    with pytest.raises(wb.WarpBridgeError, match="argument 'x' requires gradients.*forward only"):
        op(w, wp.array(x, dtype=wp.float64))


def test_unsupported_devices_and_dtypes_are_clear_errors():
    op = wb.op(K.mul64, name="dl_mul_err")
    x = rand(3)
    with pytest.raises(wb.WarpBridgeError, match=r"argument 'x' lives on DLPack device type 8 \(Metal\).*CPU"):
        op(Producer(x, device=(8, 0)), Producer(x))
    with pytest.raises(wb.WarpBridgeError, match="argument 'y' has dtype float32.*expected float64|'y'.*float32"):
        op(Producer(x), Producer(x.astype(np.float32)))
    with pytest.raises(wb.WarpBridgeError, match="argument 'x' could not be shared through DLPack"):
        op(Producer(x.astype(np.complex128)), Producer(x))


@pytest.mark.skipif(wp.is_cuda_available(), reason="checks the error on machines without CUDA")
def test_a_cuda_array_without_cuda_is_a_clear_error():
    with pytest.raises(wb.WarpBridgeError, match="argument 'x' is a CUDA array, but Warp finds no CUDA device"):
        wb.op(K.mul64, name="dl_mul_cuda")(CudaOnly(3), CudaOnly(3))


def test_mixing_a_producer_with_torch_names_the_conversion():
    op = wb.op(K.mul64, name="dl_mul_mixed")
    t = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(wb.WarpBridgeError, match=r"got torch and dlpack.*torch\.from_dlpack\(x\) shares its memory"):
        op(t, Producer(rand(3)))
    # the suggested conversion works, and is zero-copy
    x = rand(3)
    tx = torch.from_dlpack(Producer(x))
    assert tx.data_ptr() == x.ctypes.data
    torch.testing.assert_close(op(t, tx), torch.zeros(3, dtype=torch.float64))


# -- CUDA producers ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_dlpack_producer_gives_wp_arrays():
    op = wb.op(K.mul64, name="dl_mul_cuda_dlpack")
    x = torch.rand(1000, dtype=torch.float64, device="cuda")
    y = torch.rand(1000, dtype=torch.float64, device="cuda")
    out = op(Producer(x), Producer(y))
    assert isinstance(out, wp.array) and out.device.is_cuda
    torch.testing.assert_close(torch.from_dlpack(out), torch.sin(x) * y)


@pytest.mark.gpu
def test_cuda_array_interface_producer():
    class Cai:
        def __init__(self, t):
            self.t = t
            self.__cuda_array_interface__ = t.__cuda_array_interface__

    op = wb.op(K.mul64, name="dl_mul_cai")
    x = torch.rand(100, dtype=torch.float64, device="cuda")
    out = op(Cai(x), Cai(x))
    torch.testing.assert_close(torch.from_dlpack(out), torch.sin(x) * x)


@pytest.mark.gpu
def test_cupy_in_cupy_out():
    cupy = pytest.importorskip("cupy")
    op = wb.op(K.mul64, name="dl_mul_cupy")
    x = cupy.random.rand(1000)
    out = op(x, x)
    assert isinstance(out, cupy.ndarray)
    cupy.testing.assert_allclose(out, cupy.sin(x) * x)
