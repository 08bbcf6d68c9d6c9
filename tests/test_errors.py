"""Bad input: one WarpBridgeError naming the op and the argument, what was expected and what
came, raised before any launch (no launch plan is even built)."""

import kernels as K
import numpy as np
import pytest
import torch
import warp as wp

import warpbridge as wb


def raises(op, match, *args, **kwargs):
    plans = dict(op._plans)
    with pytest.raises(wb.WarpBridgeError, match=match):
        op(*args, **kwargs)
    assert op._plans == plans, "the error must come before anything is launched (no new plan)"


def test_error_class_is_both_type_and_value_error():
    assert issubclass(wb.WarpBridgeError, TypeError) and issubclass(wb.WarpBridgeError, ValueError)


def test_wrong_number_of_inputs():
    raises(wb.op(K.mul64), r"mul64\(\): expected 2 input\(s\) \(x, y\), got 1", torch.zeros(3, dtype=torch.float64))


def test_missing_scalar():
    x = torch.zeros(3, dtype=torch.float64)
    raises(wb.op(K.scale_shift), r"scale_shift\(\): expected 4 input\(s\) \(x, s, n, flag\), got 3", x, 1.0, 2)


def test_scalar_of_the_wrong_kind():
    op = wb.op(K.scale_shift)
    x = torch.zeros(3, dtype=torch.float64)
    raises(op, r"argument 'n' must be a Python int \(int32 scalar\), got float 2.5", x, 1.0, 2.5, True)
    raises(
        op,
        r"argument 's' must be a Python number.*got Tensor of shape \(\).*not differentiable",
        x,
        torch.tensor(1.0),
        2,
        True,
    )
    raises(op, r"argument 'n' = 4294967296 does not fit int32", x, 1.0, 2**32, True)
    raises(op, r"argument 'flag' must be a bool, got int 1", x, 1.0, 2, 1)


def test_dtype_mismatch_is_never_cast():
    op = wb.op(K.mul64)
    raises(
        op,
        r"mul64\(\): argument 'y' must have dtype float64, got float32 \(warpbridge never casts\)",
        torch.zeros(3, dtype=torch.float64),
        torch.zeros(3),
    )


def test_unsupported_tensor_dtype():
    raises(
        wb.op(K.square),
        r"argument 'x' has dtype torch.complex64, which Warp cannot use; expected float32",
        torch.zeros(3, dtype=torch.complex64),
    )


def test_ndim_mismatch():
    raises(wb.op(K.square), r"square\(\): argument 'x' must be 1-D, got shape \(2, 3\)", torch.zeros(2, 3))


def test_vector_matrix_trailing_dims():
    op = wb.op(K.vec_mat, num_outputs=2)
    v, m = torch.zeros(4, 3, dtype=torch.float64), torch.zeros(4, 3, 3, dtype=torch.float64)
    raises(
        op,
        r"argument 'v' must have trailing dims \(3,\) for its Warp dtype, got shape \(4, 4\)",
        torch.zeros(4, 4, dtype=torch.float64),
        m,
        1.0,
    )
    raises(
        op,
        r"argument 'm' must be 3-D \(1 array dims \+ trailing \(3, 3\)\), got shape \(4, 9\)",
        v,
        torch.zeros(4, 9, dtype=torch.float64),
        1.0,
    )


def test_non_tensor_where_an_array_is_expected():
    op = wb.op(K.mul64)
    raises(op, r"argument 'x' must be an array .*got builtins.list", [1.0, 2.0], torch.zeros(2, dtype=torch.float64))
    raises(
        op,
        r"argument 'y' must be an array \(a 1-D float64 array\): a torch, NumPy, JAX or Paddle array, or any array "
        r"exposing __dlpack__ or __cuda_array_interface__; got float 3.0",
        torch.zeros(2, dtype=torch.float64),
        3.0,
    )


def test_mixed_frameworks():
    raises(
        wb.op(K.mul64),
        r"all arrays must come from one framework, got torch and numpy",
        torch.zeros(2, dtype=torch.float64),
        np.zeros(2),
    )


def test_tensors_on_different_devices():
    op = wb.op(K.mul64)
    # the only second device a CPU machine has is "meta", which holds no data: refused as such
    # before the device check (tests/test_gpu.py checks cpu against cuda)
    raises(
        op,
        r"argument 'y' is a meta tensor \(it has no data\)",
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.float64, device="meta"),
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"launch_dims": (2, -1)}, r"launch_dims must be 1 to 4 non-negative ints, got \(2, -1\)"),
        ({"launch_dims": (1, 1, 1, 1, 1)}, r"launch_dims must be 1 to 4"),
        ({"launch_dims": "abc"}, r"launch_dims must be 1 to 4 non-negative ints"),
        ({"launch_dims": 2.5}, r"launch_dims must be an int or a tuple of ints, got 2.5"),
        ({"output_dims": {"nope": 3}}, r"output_dims names unknown output\(s\) \['nope'\]; the outputs are \['c'\]"),
        ({"output_dims": (3,)}, r"output 'c' is a 2-D array but output_dims give 1 dims"),
    ],
)
def test_malformed_launch_and_output_dims(kwargs, match):
    a = torch.zeros(3, dtype=torch.float64)
    raises(wb.op(K.outer), r"outer\(\): " + match, a, a, **kwargs)


def test_default_launch_dims_of_the_wrong_rank_for_an_output():
    a = torch.zeros(3, dtype=torch.float64)
    raises(wb.op(K.outer), r"output 'c' is a 2-D array but the launch dims \(3,\) give 1 dims; pass output_dims", a, a)


def test_construction_errors():
    with pytest.raises(wb.WarpBridgeError, match=r"writes to its input array\(s\) \['a'\]"):
        wb.op(K.writes_input)
    with pytest.raises(
        wb.WarpBridgeError, match=r"num_outputs must be an int between 1 and the number of parameters \(2\), got 3"
    ):
        wb.op(K.square, num_outputs=3)
    with pytest.raises(
        wb.WarpBridgeError,
        match=r"the last 2 parameter\(s\) are outputs and must be arrays, but 'flag' is a bool scalar",
    ):
        wb.op(K.scale_shift, num_outputs=2)
    with pytest.raises(wb.WarpBridgeError, match=r"name must be a Python identifier"):
        wb.op(K.square, name="not valid")
    with pytest.raises(wb.WarpBridgeError, match=r"expects a wp.Kernel or an annotated function, got int"):
        wb.op(3)

    def unannotated(x, y):
        pass

    with pytest.raises(wb.WarpBridgeError, match=r"parameter 'x' of unannotated\(\) needs a Warp type annotation"):
        wb.op(unannotated)


def test_arrays_too_large_for_warps_32_bit_descriptors():
    op = wb.op(K.square)
    with pytest.raises(wb.WarpBridgeError, match=r"square\(\): argument 'x' is too large"):
        op(torch.zeros(1).expand(2**31))


def test_kernel_parameter_types_warpbridge_cannot_handle():
    # (wp.struct scalars, indexedarray inputs and generic kernels are supported: test_custom_backward.py)
    @wp.kernel
    def indexed_output(x: wp.array(dtype=float), y: wp.indexedarray(dtype=float)):
        y[wp.tid()] = x[wp.tid()]

    with pytest.raises(wb.WarpBridgeError, match=r"indexed_output\(\): parameter 'y' is a wp.indexedarray output"):
        wb.op(indexed_output)


def test_arrays_shorter_than_the_launch_are_refused_before_any_launch():
    add = wb.op(K.mul64)
    with pytest.raises(wb.WarpBridgeError, match=r"argument 'y' has shape \(2,\).*dimension 0.*launch dims are \(5,\)"):
        add(torch.ones(5, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    sq = wb.op(K.square)
    with pytest.raises(wb.WarpBridgeError, match=r"argument 'x' has shape \(3,\).*launch dims are \(8,\)"):
        sq(torch.ones(3), launch_dims=(8,))
    with pytest.raises(wb.WarpBridgeError, match=r"output 'y' has shape \(2,\).*launch dims are \(3,\)"):
        sq(torch.ones(3), output_dims=(2,))
    # longer arrays, or a launch that fits, are fine
    torch.testing.assert_close(
        add(torch.zeros(3, dtype=torch.float64), torch.ones(4, dtype=torch.float64)),
        torch.zeros(3, dtype=torch.float64),
    )
    torch.testing.assert_close(
        sq(torch.full((6,), 2.0), launch_dims=(4,), output_dims=(6,)), torch.tensor([4.0] * 4 + [0.0] * 2)
    )
