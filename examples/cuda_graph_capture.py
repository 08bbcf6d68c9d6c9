"""Capture PyTorch and Warp work in one CUDA graph (the shared-stream capture of Warp's
interoperability guide).

warpbridge launches on PyTorch's current stream, so inside `torch.cuda.graph(...)` an op is
captured like any PyTorch kernel: no Warp stream to share by hand, no ScopedCapture. The
graph here is a whole training step (forward, backward into static gradient buffers, SGD).
Needs a CUDA device; without one it says so and returns None.

Run: python examples/cuda_graph_capture.py
"""

import torch
import warp as wp

import warpbridge as wb


@wb.op
@wp.kernel
def scaled_square(x: wp.array(dtype=float), scale: float, y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = scale * x[i] * x[i]


def main(n: int = 4096, replays: int = 50):
    if not torch.cuda.is_available():
        print("no CUDA device: CUDA graph capture needs one (nothing to do on the CPU)")
        return None
    x = torch.linspace(-2, 2, n, device="cuda").requires_grad_()
    x.grad = torch.zeros_like(x)  # a static gradient buffer, so the graph's addresses stay fixed

    def step():
        loss = scaled_square(x, 0.5).sum()
        grad = torch.autograd.grad(loss, x)[0]
        with torch.no_grad():
            x.grad.copy_(grad)
            x.sub_(0.05 * grad)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compiles the module, caches the plan) off the default stream
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    start = x.detach().clone()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    # gradient descent on 0.5 x^2 with lr 0.05: x <- 0.95 x per step
    expect = start * 0.95**replays
    torch.testing.assert_close(x.detach(), expect, rtol=1e-4, atol=1e-6)
    print(f"{replays} graph replays of a training step: x shrank by {0.95**replays:.4f}, as gradient descent should")
    return x.detach()


if __name__ == "__main__":
    main()
