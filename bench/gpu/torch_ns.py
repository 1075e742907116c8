#!/usr/bin/env python3
"""PyTorch reference for bench/gpu/run.sh: the same Newton-Schulz loop on the same GPU.

Emerging-Optimizers' form (quintic, 5 steps, X / max(||X||, eps), work on the wide orientation):
  A = X @ X.T; B = addmm(A, A, A, beta=b, alpha=c); X = addmm(X, B, X, beta=a).
MEDIUM runs it in bf16 (the trainers' reference loop); HIGHEST in fp32 with TF32 off.
Prints CSV lines: shape,precision,torch_ms,torch_tflops (median of --iters after --warmup,
timed with CUDA events). With --sets=FILE:NAME,... (sets of bench/gpu/model_sets.txt) it times
each set's matrices one after the other, resident on the GPU, and prints
set,name,precision,matrices,torch_ms. Exits 3 when torch or a CUDA device is not available.
"""
import argparse
import statistics
import sys

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]


def ns(g, steps, dtype, eps=1e-7):
    x = g.to(dtype)
    transpose = x.shape[0] > x.shape[1]
    if transpose:
        x = x.T
    x = x / x.norm().clamp_min(eps)
    for i in range(steps):
        a, b, c = QUINTIC[i % len(QUINTIC)]
        gram = x @ x.T
        bmat = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, bmat, x, beta=a)
    return x.T if transpose else x


def read_sets(spec):
    """{name: [(rows, cols), ...]} for the names of "FILE:NAME,NAME" (model_sets.txt's format)."""
    path, names = spec.rsplit(":", 1)
    sets = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, items = line.split(":", 1)
            shapes = []
            for item in items.split(","):
                shape, count = item.strip().split("*")
                rows, cols = (int(v) for v in shape.split("x"))
                shapes += [(rows, cols)] * int(count)
            sets[name.strip()] = shapes
    missing = [n for n in names.split(",") if n not in sets]
    if missing:
        raise SystemExit(f"no set {missing[0]!r} in {path}")
    return {n: sets[n] for n in names.split(",")}


def time_ms(fn, warmup, iters):
    times = []
    for it in range(warmup + iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        if it >= warmup:
            times.append(start.elapsed_time(stop))
    return statistics.median(times)


def flops(rows, cols, steps):
    m, n = min(rows, cols), max(rows, cols)
    return steps * (2.0 * m * m * n + 2.0 * m * m * m + 2.0 * m * m * n)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="1024x1024,4096x4096,4096x11008,8192x8192")
    p.add_argument("--precisions", default="medium,highest")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--sets", default="", help="FILE:NAME,... of bench/gpu/model_sets.txt")
    args = p.parse_args()
    sets = read_sets(args.sets) if args.sets else {}
    global torch
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"torch not importable: {e}", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 3
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}", file=sys.stderr)
    print("shape,precision,torch_ms,torch_tflops")
    for shape in args.shapes.split(","):
        rows, cols = (int(v) for v in shape.split("x"))
        g = torch.randn(rows, cols, device="cuda", dtype=torch.float32)
        for prec in args.precisions.split(","):
            dtype = torch.bfloat16 if prec == "medium" else torch.float32
            if prec == "high":
                torch.backends.cuda.matmul.allow_tf32 = True
            ms = time_ms(lambda: ns(g, args.steps, dtype), args.warmup, args.iters)
            torch.backends.cuda.matmul.allow_tf32 = False
            print(f"{shape},{prec},{ms:.3f},{flops(rows, cols, args.steps) / (ms * 1e-3) / 1e12:.1f}", flush=True)
    for name, shapes in sets.items():
        gs = [torch.randn(r, c, device="cuda", dtype=torch.float32) for r, c in shapes]
        for prec in args.precisions.split(","):
            dtype = torch.bfloat16 if prec == "medium" else torch.float32
            torch.backends.cuda.matmul.allow_tf32 = prec == "high"

            def run_set():
                for g in gs:
                    ns(g, args.steps, dtype)

            ms = time_ms(run_set, args.warmup, args.iters)
            torch.backends.cuda.matmul.allow_tf32 = False
            print(f"set,{name},{prec},{len(shapes)},{ms:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
