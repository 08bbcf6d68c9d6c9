"""GradBuffer in one process: aliasing, exact values in every pattern a training loop uses,
direct write from warpbridge ops, bad input. The distributed half is in test_distributed.py."""

import copy

import pytest
import torch
import warp as wp
from kernels import axpb

import warpbridge as wb
from warpbridge import GradBuffer, WarpBridgeError
from warpbridge._backends.torch import backend as torch_core


def mlp(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
    ).to(dtype)


def batches(n, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 6, generator=g, dtype=dtype), torch.randn(8, 3, generator=g, dtype=dtype)) for _ in range(n)
    ]


def loss_of(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def reference_grads(model, bs):
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    for b in bs:
        loss_of(ref, b).backward()
    return [p.grad.clone() for p in ref.parameters()]


def assert_aliased(gb, model):
    base = gb.buffer.untyped_storage().data_ptr()
    for p in model.parameters():
        assert p.grad is not None and p.grad.untyped_storage().data_ptr() == base
        offset = (p.grad.data_ptr() - gb.buffer.data_ptr()) // p.grad.element_size()
        assert (offset * p.grad.element_size()) % 256 == 0
        assert p.grad.stride() == p.stride()


def test_grads_alias_the_buffer_and_equal_plain_pytorch():
    model = mlp()
    expect = reference_grads(model, batches(1))
    gb = GradBuffer(model.parameters())
    loss_of(model, batches(1)[0]).backward()
    assert_aliased(gb, model)
    for p, e in zip(model.parameters(), expect):
        assert torch.equal(p.grad, e)


class _GistPackedLinear(torch.autograd.Function):
    """The gist's pattern (004): backward writes the weight gradient into a buffer slice with
    mm(out=...) and returns that slice, so AccumulateGrad "steals" it as .grad."""

    @staticmethod
    def forward(ctx, x, weight, buf_slice):
        ctx.save_for_backward(x)
        ctx.buf_slice = buf_slice
        return x @ weight.T

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        out, ctx.buf_slice = ctx.buf_slice, None
        torch.mm(grad_output.T, x, out=out)
        return None, out, None


def test_micro_batches_sum_where_the_gist_returns_twice_the_last():
    xs = [torch.randn(2, 4, dtype=torch.float64) for _ in range(2)]
    w0 = torch.randn(3, 4, dtype=torch.float64)
    expect = sum(torch.ones(2, 3, dtype=torch.float64).T @ x for x in xs)  # d/dw of sum(x @ w.T)

    w_gist = w0.clone().requires_grad_()
    buf = torch.zeros(12, dtype=torch.float64)
    for x in xs:
        _GistPackedLinear.apply(x, w_gist, buf.view(3, 4)).sum().backward()
    # second micro-batch: mm(out=) overwrites the .grad that AccumulateGrad then adds to itself
    assert torch.allclose(w_gist.grad, 2 * (torch.ones(2, 3, dtype=torch.float64).T @ xs[1]))
    assert not torch.allclose(w_gist.grad, expect)

    w = w0.clone().requires_grad_()
    gb = GradBuffer([w])
    for x in xs:
        (x @ w.T).sum().backward()
    torch.testing.assert_close(w.grad, expect)
    assert w.grad.data_ptr() == gb.buffer.data_ptr()


def test_micro_batches_accumulate_exactly():
    model = mlp()
    bs = batches(4)
    expect = reference_grads(model, bs)
    gb = GradBuffer(model.parameters())
    for b in bs:
        loss_of(model, b).backward()
    assert_aliased(gb, model)
    for p, e in zip(model.parameters(), expect):
        torch.testing.assert_close(p.grad, e, rtol=0, atol=1e-15)


@pytest.mark.parametrize("how", ["optimizer set_to_none", "model.zero_grad", "zero_grad(False)", "gb.zero_"])
def test_zeroing_patterns_keep_the_next_backward_in_the_buffer(how):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    gb = GradBuffer(model.parameters())
    loss_of(model, batches(1, seed=5)[0]).backward()  # stale values that must not leak
    {
        "optimizer set_to_none": lambda: opt.zero_grad(),
        "model.zero_grad": lambda: model.zero_grad(),
        "zero_grad(False)": lambda: opt.zero_grad(set_to_none=False),
        "gb.zero_": gb.zero_,
    }[how]()
    bs = batches(2)
    for b in bs:
        loss_of(model, b).backward()
    assert_aliased(gb, model)
    for p, e in zip(model.parameters(), reference_grads(model, bs)):
        torch.testing.assert_close(p.grad, e, rtol=0, atol=1e-15)


def test_parameters_without_gradient_this_step():
    model = mlp()
    extra = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    gb = GradBuffer([*model.parameters(), extra])
    opt = torch.optim.SGD([*model.parameters(), extra], lr=0.1)
    opt.zero_grad()
    loss_of(model, batches(1)[0]).backward()
    assert extra.grad is None  # PyTorch semantics: no gradient, no .grad
    before = extra.detach().clone()
    opt.step()
    assert torch.equal(extra.detach(), before)
    gb.zero_()
    assert torch.equal(extra.grad, torch.zeros(5, dtype=torch.float64))


def test_tied_parameters_are_managed_once_and_summed():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4).double()
    head = torch.nn.Linear(4, 10, bias=False).double()
    head.weight = emb.weight  # tied
    params = [*emb.parameters(), *head.parameters()]
    assert params[0] is params[1]
    idx = torch.tensor([1, 3, 3, 7])

    def loss():
        return head(emb(idx)).logsumexp(-1).sum()

    loss().backward()
    expect = emb.weight.grad.clone()
    emb.weight.grad = None
    gb = GradBuffer(params)
    assert len(gb.params) == 1
    loss().backward()
    torch.testing.assert_close(emb.weight.grad, expect)
    assert emb.weight.grad.data_ptr() == gb.buffer.data_ptr()


@pytest.mark.filterwarnings(r"ignore:Using backward\(\) with create_graph=True")
def test_create_graph_stays_correct_and_sync_restores_aliasing():
    model = mlp()
    b = batches(1)[0]
    ref = copy.deepcopy(model)
    g_ref = torch.autograd.grad(loss_of(ref, b), list(ref.parameters()), create_graph=True)
    gb = GradBuffer(model.parameters())
    loss_of(model, b).backward(create_graph=True)
    for p, e in zip(model.parameters(), g_ref):
        torch.testing.assert_close(p.grad, e)
    # the .grad built with a graph is differentiable (double backward works) ...
    sum((p.grad**2).sum() for p in model.parameters()).backward()
    gb.sync()  # ... and sync brings the values back under the buffer
    assert_aliased(gb, model)


def test_adam_training_equals_plain_training():
    a, b = mlp(), mlp()
    gb = GradBuffer(b.parameters())
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-2)
    opt_b = torch.optim.Adam(b.parameters(), lr=1e-2)
    for batch in batches(12):
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            loss_of(model, batch).backward()
            opt.step()
    assert_aliased(gb, b)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_buckets_cover_every_parameter_once():
    model = mlp()
    gb = GradBuffer(model.parameters(), bucket_bytes=1024)
    assert len(gb.buckets) > 1
    members = [id(p) for bkt in gb.buckets for p in bkt.params]
    assert sorted(members) == sorted(id(p) for p in model.parameters())
    for bkt in gb.buckets:
        for p in bkt.params:
            v = gb.view(p)
            lo = bkt.tensor.data_ptr()
            hi = lo + bkt.tensor.numel() * bkt.tensor.element_size()
            assert lo <= v.data_ptr() and v.data_ptr() + v.numel() * v.element_size() <= hi
    one = GradBuffer(mlp(1).parameters())
    assert len(one.buckets) == 1


def test_all_reduce_and_wait_without_a_process_group_are_no_ops():
    model = mlp()
    gb = GradBuffer(model.parameters(), overlap=True)
    loss_of(model, batches(1)[0]).backward()
    before = gb.buffer.clone()
    assert gb.all_reduce() == 0 and gb.wait() == 0
    assert torch.equal(gb.buffer, before)


# -- direct write from warpbridge ops ----------------------------------------------------------

shift_op = wb.op(axpb)  # y[i] = a * x[i] + b[i]: x and b arrays, a a scalar


def _layer_loss(x, b):
    return (shift_op(x, 1.5, b) ** 2).sum()


def test_direct_write_adds_into_the_buffer_and_returns_none(monkeypatch):
    x = torch.randn(50, dtype=torch.float64)
    b = torch.nn.Parameter(torch.randn(50, dtype=torch.float64))
    expect = sum(torch.autograd.grad(_layer_loss(x, b), b)[0] for _ in range(3))
    gb = GradBuffer([b])
    returned, posted = [], []
    real = torch_core.backward
    monkeypatch.setattr(torch_core, "backward", lambda *a, **k: returned.append(real(*a, **k)) or returned[-1])
    b.register_post_accumulate_grad_hook(lambda p: posted.append(1))
    for _ in range(3):  # micro-batches
        _layer_loss(x, b).backward()
    torch.testing.assert_close(b.grad, expect)
    assert b.grad.data_ptr() == gb.buffer.data_ptr()
    assert all(r[1] is None for r in returned)  # no gradient tensor for b: the adjoint wrote the buffer
    assert posted == [1, 1, 1]  # post-accumulate-grad hooks still run, once per backward


def test_direct_write_after_set_to_none_and_with_other_uses():
    x = torch.randn(30, dtype=torch.float64)
    b = torch.nn.Parameter(torch.randn(30, dtype=torch.float64))

    def loss():  # b reaches the loss through the op and through plain PyTorch
        return _layer_loss(x, b) + (b**3).sum()

    expect = torch.autograd.grad(loss(), b)[0]
    gb = GradBuffer([b])
    loss().backward()
    b.grad = None  # optimizer.zero_grad() default
    loss().backward()
    torch.testing.assert_close(b.grad, expect)
    assert b.grad.data_ptr() == gb.buffer.data_ptr()


def test_autograd_grad_is_not_redirected():
    x = torch.randn(20, dtype=torch.float64)
    b = torch.nn.Parameter(torch.randn(20, dtype=torch.float64))
    gb = GradBuffer([b])
    gb.zero_()
    (g,) = torch.autograd.grad(_layer_loss(x, b), b)
    torch.testing.assert_close(g, 2 * (1.5 * x + b.detach()))
    assert torch.equal(b.grad, torch.zeros_like(b))  # .grad untouched


@pytest.mark.compile
def test_direct_write_under_torch_compile_falls_back_correctly():
    x = torch.randn(40, dtype=torch.float64)
    b = torch.nn.Parameter(torch.randn(40, dtype=torch.float64))
    expect = 2 * torch.autograd.grad(_layer_loss(x, b), b)[0]
    gb = GradBuffer([b])
    f = torch.compile(_layer_loss, fullgraph=True, backend="aot_eager")
    f(x, b).backward()
    f(x, b).backward()
    torch.testing.assert_close(b.grad, expect)
    assert b.grad.data_ptr() == gb.buffer.data_ptr()


def test_neighbour_op_features_from_a_managed_parameter():
    g = torch.Generator().manual_seed(3)
    q = torch.rand(40, 3, generator=g, dtype=torch.float64) * 2 - 1
    r = torch.randn(60, 3, generator=g, dtype=torch.float64)
    f = torch.nn.Parameter(torch.randn(60, 4, generator=g, dtype=torch.float64))
    expect = torch.autograd.grad(wb.ops.radius_aggregate(q, r, f, 0.6, 0.2).sum(), f)[0]
    gb = GradBuffer([f])
    wb.ops.radius_aggregate(q, r, f, 0.6, 0.2).sum().backward()
    torch.testing.assert_close(f.grad, expect)
    assert f.grad.data_ptr() == gb.buffer.data_ptr()


# -- bad input -----------------------------------------------------------------------------------


def test_bad_input():
    p = torch.nn.Parameter(torch.randn(3))
    with pytest.raises(WarpBridgeError, match=r"GradBuffer\(\): parameter 1 must be a leaf tensor"):
        GradBuffer([p, p * 2])
    with pytest.raises(WarpBridgeError, match="different devices .*make one GradBuffer per device"):
        GradBuffer([p, torch.nn.Parameter(torch.randn(3, device="meta"))])
    with pytest.raises(WarpBridgeError, match="must have the buffer's dtype"):
        GradBuffer([p, torch.nn.Parameter(torch.randn(3, dtype=torch.float64))])
    with pytest.raises(WarpBridgeError, match="parameter 0 must be a torch.Tensor, got numpy.ndarray"):
        GradBuffer([p.detach().numpy()])
    with pytest.raises(WarpBridgeError, match="no parameter requires grad"):
        GradBuffer([torch.randn(3)])
    with pytest.raises(WarpBridgeError, match="'bucket_bytes' must be a positive int"):
        GradBuffer([p], bucket_bytes=0)
    gb = GradBuffer([p, torch.randn(2)])  # frozen tensors are skipped
    assert gb.params == [p]
    with pytest.raises(WarpBridgeError, match="already managed by another GradBuffer"):
        GradBuffer([p])
    gb.close()
    GradBuffer([p]).close()  # after close() it can be managed again


def test_warp_kernel_is_importable_here():
    assert isinstance(axpb, wp.Kernel)


def test_a_tensor_hook_on_a_managed_parameter_sees_the_ops_gradient():
    # as in plain PyTorch: the hook receives the gradient and its result is what accumulates
    b = torch.nn.Parameter(torch.rand(4, dtype=torch.float64))
    x = torch.rand(4, dtype=torch.float64)
    gb = GradBuffer([b])
    seen = []
    b.register_hook(lambda g: (seen.append(g.clone()), 3.0 * g)[1])
    for step in range(1, 3):
        shift_op(x, 2.0, b).pow(2).sum().backward()
        want = 2 * (2.0 * x + b.detach())
        torch.testing.assert_close(seen[-1], want)
        torch.testing.assert_close(b.grad, 3.0 * want * step)  # accumulated over the two steps
        assert b.grad.data_ptr() == gb.view(b).data_ptr()  # still in the buffer
