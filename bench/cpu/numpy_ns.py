#!/usr/bin/env python3
"""numpy + OpenBLAS running the same Newton–Schulz loop as the CPU backend (quintic, 5 steps).

HIGHEST: fp32 numpy matmuls — A = X @ X.T (numpy itself turns this into OpenBLAS ssyrk),
B = b·A + c·(A @ A) (sgemm), X = a·X + B @ X (sgemm), with in-place elementwise ops.
MEDIUM: the same fp32 matmuls plus bf16 rounding emulation (round-to-nearest-even on the fp32
bits) of X after normalization and of A, B and the new X after each product, as the engine's
contract says. Prints one JSON line per case with the median real and CPU (process) times.

  OPENBLAS_NUM_THREADS=1 python3 numpy_ns.py [--reps N] [--shapes 512x512,1024x4096]
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]


def round_bf16(x):
    """Rounds a float32 array to bf16 in place (nearest even), keeping float32 storage."""
    u = x.view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    u &= np.uint32(0xFFFF0000)
    return x


def newton_schulz(g, medium, steps=5, eps=1e-7):
    rows, cols = g.shape
    x = np.ascontiguousarray(g.T) if rows > cols else g.copy()
    x /= np.float32(max(float(np.linalg.norm(x)), eps))
    if medium:
        round_bf16(x)
    for i in range(steps):
        a, b, c = (np.float32(v) for v in QUINTIC[i % len(QUINTIC)])
        s = x @ x.T
        if medium:
            round_bf16(s)
        bm = s @ s
        bm *= c
        bm += b * s
        if medium:
            round_bf16(bm)
        y = bm @ x
        y += a * x
        if medium:
            round_bf16(y)
        x = y
    out = x.T if rows > cols else x
    return out * np.float32(max(rows, cols) ** 0.5)


def blas_name():
    try:
        info = np.show_config(mode="dicts")  # numpy >= 2
        blas = info["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version', '')}".strip()
    except Exception:  # numpy 1.x: no dict mode; Debian's numpy uses the libblas.so.3 alternative.
        return "libblas.so.3 (Debian alternative)"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--shapes", default="512x512,1024x1024,1024x4096,2048x2048")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    for medium in (False, True):
        for shape in args.shapes.split(","):
            rows, cols = (int(v) for v in shape.split("x"))
            g = rng.standard_normal((rows, cols), dtype=np.float32)
            newton_schulz(g, medium)  # Warm-up.
            real, cpu = [], []
            for _ in range(args.reps):
                r0, c0 = time.perf_counter(), time.process_time()
                newton_schulz(g, medium)
                real.append(time.perf_counter() - r0)
                cpu.append(time.process_time() - c0)
            print(json.dumps({"rows": rows, "cols": cols, "precision": "medium" if medium else "highest",
                              "real_ms": 1e3 * statistics.median(real), "cpu_ms": 1e3 * statistics.median(cpu),
                              "reps": args.reps, "numpy": np.__version__, "blas": blas_name(),
                              "python": sys.executable}), flush=True)


if __name__ == "__main__":
    main()
