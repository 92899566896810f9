#!/usr/bin/env python3
"""ew_torch.py - benchmark: ns per element of PyTorch's f32 elementwise kernels on the CPU (ATen/oneDNN), one thread, to set beside bench/ew_isa's.

usage: ew_torch.py [N]   N elements (default 1000003), a over [-4, 4), dy = 1,
       ew_torch.py --rows [ROWS [COLS]]   the row kernels alone (default 4096 x 256)

as bench/ew_isa N. Each op is timed by the best thread CPU time of 15 rounds
of ~2M elements, calling the ATen op directly with an output tensor given
(no autograd, no allocation in the loop): gelu and gelu_grad
(aten.gelu_backward) in both forms (approximate "none" = erf, "tanh"), erf,
exp, tanh, sigmoid. Then softmax and layer_norm (gamma, beta, eps 1e-5)
over 4096 rows of 256, forward (no autograd) and forward + backward
(y.backward(dy), gradients of x, gamma and beta), as bench/ew_cpu's rows;
these by the process's CPU time.
Prints one row per op, "op<TAB>ns".

--rows times the row kernels alone, as bench/row_isa does alloy's: ATen's
ops called with out= where they have one (softmax, also with a causal
mask's -inf above each row's diagonal as row_isa's softmax_causal, softmax_backward_data,
native_layer_norm, native_layer_norm_backward with only dx asked for;
cross_entropy as cross_entropy_loss without reduction, each row's loss, and
its gradient as autograd runs it for the mean loss from the saved log-softmax:
nll_loss_backward then _log_softmax_backward_data, both with out=), on
the same x, dy, gamma = beta and targets ((r * 31) mod COLS) as row_isa, best thread CPU time of 15
rounds of >= 2M elements, ns per element.
"""
import sys
import time
import warnings


def rows_only(torch, rows, cols):
    """The row kernels alone: ATen's ops on tensors already in place."""
    aten = torch.ops.aten
    i = torch.arange(rows * cols, dtype=torch.int64)
    x = ((i * 7919 % 65536).double() / 65536 * 8 - 4).float().view(rows, cols)
    dy = (1 - i % 3).float().view(rows, cols)
    gamma = 1 + 0.01 * torch.arange(cols, dtype=torch.float32)
    beta = gamma.clone()
    xm = torch.where(i % cols > (i // cols) % cols, float("-inf"), x.view(-1)).view(rows, cols)
    y = torch.empty(rows, cols)
    sm = torch.softmax(x, 1)
    _, mean, rstd = aten.native_layer_norm(x, [cols], gamma, beta, 1e-5)
    mean_o, rstd_o = torch.empty_like(mean), torch.empty_like(rstd)
    targets = torch.arange(rows, dtype=torch.int64) * 31 % cols
    logp = torch.log_softmax(x, 1)
    dloss, total_weight, dlogp = torch.tensor(1.0), torch.tensor(float(rows)), torch.empty(rows, cols)

    def cross_entropy_grad():
        aten.nll_loss_backward.grad_input(dloss, logp, targets, None, 1, -100, total_weight, grad_input=dlogp)
        aten._log_softmax_backward_data.out(dlogp, logp, 1, torch.float32, out=y)

    ops = {
        "softmax": lambda: aten._softmax.out(x, 1, False, out=y),
        "softmax_causal": lambda: aten._softmax.out(xm, 1, False, out=y),
        "softmax_grad": lambda: aten._softmax_backward_data.out(dy, sm, 1, torch.float32, grad_input=y),
        "layer_norm": lambda: aten.native_layer_norm.out(x, [cols], gamma, beta, 1e-5, out0=y, out1=mean_o, out2=rstd_o),
        "layer_norm_grad": lambda: aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, gamma, beta,
                                                                   [True, False, False]),
        "cross_entropy": lambda: aten.cross_entropy_loss(x, targets, None, 0, -100, 0.0),
        "cross_entropy_grad": cross_entropy_grad,
    }
    reps = (2 << 20) // (rows * cols) + 1
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, f32, {rows} rows of {cols}, "
          "the kernel alone, best thread CPU time, ns per element")
    for name, fn in ops.items():
        best = float("inf")
        with torch.no_grad():
            for r in range(16):
                t0 = time.thread_time()
                for _ in range(reps):
                    fn()
                t = time.thread_time() - t0
                if r > 0:
                    best = min(best, t)
        print(f"{name}\t{best * 1e9 / (reps * rows * cols):.3f}")
        sys.stdout.flush()
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rows":
        import torch
        torch.set_num_threads(1)
        rows = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
        cols = int(sys.argv[3]) if len(sys.argv) > 3 else 256
        return rows_only(torch, rows, cols)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000003
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        import torch
    except ImportError as e:
        print(f"torch not installed: {e}")
        return 3
    torch.set_num_threads(1)
    a = torch.linspace(-4.0, 4.0, n + 1, dtype=torch.float32)[:n].contiguous()
    dy = torch.ones(n, dtype=torch.float32)
    y = torch.empty(n, dtype=torch.float32)
    aten = torch.ops.aten
    ops = {
        "gelu": lambda: aten.gelu.out(a, approximate="none", out=y),
        "gelu_grad": lambda: aten.gelu_backward.grad_input(dy, a, approximate="none", grad_input=y),
        "gelu_tanh": lambda: aten.gelu.out(a, approximate="tanh", out=y),
        "gelu_tanh_grad": lambda: aten.gelu_backward.grad_input(dy, a, approximate="tanh", grad_input=y),
        "erf": lambda: torch.erf(a, out=y),
        "exp": lambda: torch.exp(a, out=y),
        "tanh": lambda: torch.tanh(a, out=y),
        "sigmoid": lambda: torch.sigmoid(a, out=y),
    }
    reps = (2 << 20) // n + 1
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, f32, {n} elements, best thread CPU time, ns per element")
    for name, fn in ops.items():
        best = float("inf")
        for r in range(16):
            t0 = time.thread_time()
            for _ in range(reps):
                fn()
            t = time.thread_time() - t0
            if r > 0:
                best = min(best, t)
        print(f"{name}\t{best * 1e9 / (reps * n):.3f}")
        sys.stdout.flush()
    rows, cols = 4096, 256
    x = (torch.arange(rows * cols, dtype=torch.float64) * 7919 % 65536 / 65536 * 8 - 4).float().view(rows, cols)
    rdy = (1 - torch.arange(rows * cols) % 3).float().view(rows, cols)
    gamma = (1 + 0.01 * torch.arange(cols, dtype=torch.float32))
    beta = gamma.clone()
    xg, gg, bg = (t.clone().requires_grad_() for t in (x, gamma, beta))

    def fb(f):
        xg.grad = gg.grad = bg.grad = None
        f().backward(rdy)

    nograd = torch.no_grad
    rowops = {
        "softmax": lambda: torch.softmax(x, 1),
        "softmax_fb": lambda: fb(lambda: torch.softmax(xg, 1)),
        "layer_norm": lambda: torch.nn.functional.layer_norm(x, (cols,), gamma, beta, 1e-5),
        "l_norm_fb": lambda: fb(lambda: torch.nn.functional.layer_norm(xg, (cols,), gg, bg, 1e-5)),
    }
    for name, fn in rowops.items():
        best = float("inf")
        for r in range(8):
            t0 = time.process_time()  # the process's: autograd may run work on its own thread
            if name.endswith("_fb"):
                fn()
            else:
                with nograd():
                    fn()
            t = time.process_time() - t0
            if r > 0:
                best = min(best, t)
        print(f"{name}\t{best * 1e9 / (rows * cols):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
