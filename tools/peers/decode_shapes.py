"""PyTorch eager on the cases of `tools/examples/decode_shapes.rs` (a decoder's step: linear
layers of a few rows, q·kᵀ·v against a cache of 512 keys, one query row's attention), the same
shapes, values in [-1, 1), medians of 30 calls over rounds, at each thread count. torch.compile
is left out: its cold compile per shape costs more than these cases run.

Usage: PY=$(bash ../shared/peers/setup.sh); $PY tools/peers/decode_shapes.py [threads,...] [rounds]
"""
import statistics, sys, time
import torch
import torch.nn.functional as F


def median_call(f, runs=30):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cases():
    out = []
    for rows in [1, 4, 12]:
        for width, hidden in [(512, 2048), (1024, 4096)]:
            x = torch.rand(rows, width) * 2 - 1
            w1 = (torch.rand(hidden, width) * 2 - 1) / width ** 0.5
            b1 = (torch.rand(hidden) * 2 - 1) / width ** 0.5
            w2 = (torch.rand(width, hidden) * 2 - 1) / hidden ** 0.5
            b2 = (torch.rand(width) * 2 - 1) / hidden ** 0.5
            f = lambda x=x, w1=w1, b1=b1, w2=w2, b2=b2: F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
            out.append((f"linear-gelu-linear {rows} x {width}/{hidden}", f))
    k = torch.rand(4, 8, 512, 64) * 2 - 1
    v = torch.rand(4, 8, 512, 64) * 2 - 1
    for rows in [1, 4]:
        q = torch.rand(4, 8, rows, 64) * 2 - 1
        out.append((f"q·kᵀ·v, q {rows} row(s), 512 keys", lambda q=q: (q @ k.transpose(2, 3)) @ v))
    q = torch.rand(4, 8, 1, 64) * 2 - 1
    out.append(("attention, 1 query row, 512 keys",
                lambda: torch.softmax((q @ k.transpose(2, 3)) * 0.125, -1) @ v))
    out.append(("  (the same as scaled_dot_product_attention)",
                lambda: F.scaled_dot_product_attention(q, k, v)))
    return out


def main():
    threads = [int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "1,2").split(",")]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    print(f"PyTorch {torch.__version__} eager, median µs a call ({rounds} rounds)")
    with torch.no_grad():
        for t in threads:
            torch.set_num_threads(t)
            print(f"{t} thread(s):")
            for name, f in cases():
                for _ in range(10):
                    f()
                m = statistics.median(median_call(f) for _ in range(rounds))
                print(f"  {name:<44} {m * 1e6:>9.1f}")


if __name__ == "__main__":
    main()
