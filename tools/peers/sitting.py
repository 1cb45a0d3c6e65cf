"""A sitting: minductor against PyTorch eager and torch.compile, interleaved workload by workload.

Usage (from the repository root, after `cargo build --release`):
    PY=$(bash ../shared/peers/setup.sh)
    $PY tools/peers/sitting.py --threads 1,2 --rounds 2 [--workloads a,b] [--out DIR]

`../shared/peers/torch_suite.py` and `minductor bench` each time one workload in its own process;
for every round, thread count and workload the two run back to back, which goes first
alternating from round to round. Running the whole PyTorch suite and then the whole minductor
suite (what `side_by_side.py` compares) lets a slow spell of a shared machine fall on one side
only; here both sides of a ratio are measured within seconds of each other. The table gives, per
thread count, the median over rounds of each system's time and minductor's ratio to the better
peer (> 1: minductor is faster), with the lowest and highest ratio of a single round beside it.
Every run's output is kept in DIR (default: a fresh temporary folder), and DIR/mT_R.json and
DIR/tT_R.jsonl hold round R at T threads in the files' usual forms, for side_by_side.py.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUITE = ["pointwise_gelu_4k", "pointwise_gelu_1m", "pointwise_gelu_16m", "softmax_4096x1024",
         "layernorm_4096x1024", "mlp_256x1024x4096", "attention_8x256x512",
         "resnet_block_8x64x56", "llama_block_4x256x512", "mlp_train_step_256"]


def run_torch(py, suite, workload, threads):
    out = subprocess.run([py, suite, "--threads", str(threads), "--only", workload],
                         capture_output=True, text=True, check=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.strip()]
    rows = [r for r in rows if r["workload"] == workload]
    if len(rows) != 1:
        sys.exit(f"torch_suite.py --only {workload} printed {len(rows)} rows for it")
    return rows[0]


def run_minductor(exe, workload, threads, path):
    subprocess.run([exe, "bench", "--workload", workload, "--threads", str(threads), "--json", path],
                   capture_output=True, text=True, check=True)
    rows = [w for w in json.load(open(path))["workloads"] if w["name"] == workload]
    if len(rows) != 1:
        sys.exit(f"minductor bench --workload {workload} wrote {len(rows)} rows for it")
    return rows[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workloads", default=",".join(SUITE), help="comma-separated names")
    ap.add_argument("--out", help="folder for every run's output (default: a new temporary one)")
    ap.add_argument("--minductor", default=os.path.join(ROOT, "target", "release", "minductor"))
    ap.add_argument("--suite", default=os.path.join(ROOT, "..", "shared", "peers", "torch_suite.py"))
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    workloads = [w for w in a.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in SUITE]
    if unknown:
        sys.exit(f"unknown workloads {unknown}: expected some of {SUITE}")
    for path, what in [(a.minductor, "the minductor binary (cargo build --release)"),
                       (a.suite, "torch_suite.py")]:
        if not os.path.exists(path):
            sys.exit(f"{what} not found at {path}")
    out = a.out or tempfile.mkdtemp(prefix="sitting_")
    os.makedirs(out, exist_ok=True)
    # results[t][w] = list of (torch row, minductor row), one per round
    results = {t: {w: [] for w in workloads} for t in threads}
    for r in range(a.rounds):
        for t in threads:
            mi_rows, to_rows = [], []
            for i, w in enumerate(workloads):
                print(f"round {r + 1}/{a.rounds}, {t} threads: {w}", file=sys.stderr, flush=True)
                m_path = os.path.join(out, f"m{t}_{r + 1}_{w}.json")
                if (r + i) % 2 == 0:
                    to = run_torch(sys.executable, a.suite, w, t)
                    mi = run_minductor(a.minductor, w, t, m_path)
                else:
                    mi = run_minductor(a.minductor, w, t, m_path)
                    to = run_torch(sys.executable, a.suite, w, t)
                results[t][w].append((to, mi))
                mi_rows.append(mi)
                to_rows.append(to)
            with open(os.path.join(out, f"m{t}_{r + 1}.json"), "w") as f:
                json.dump({"threads": t, "workloads": mi_rows}, f, indent=1)
            with open(os.path.join(out, f"t{t}_{r + 1}.jsonl"), "w") as f:
                f.writelines(json.dumps(row) + "\n" for row in to_rows)
    for t in threads:
        print(f"\n{t} threads, {a.rounds} interleaved rounds (medians; ratio: best peer / minductor)")
        print(f"{'workload':22} {'torch eager':>11} {'inductor':>9} {'minductor':>9} {'vs best':>8}"
              f" {'lowest':>7} {'highest':>7}")
        for w in workloads:
            runs = results[t][w]
            e = statistics.median(to["eager_ms"] for to, _ in runs)
            i = statistics.median(to["inductor_ms"] for to, _ in runs)
            m = statistics.median(mi["compiled"]["median_ms"] for _, mi in runs)
            per_round = [min(to["eager_ms"], to["inductor_ms"]) / mi["compiled"]["median_ms"]
                         for to, mi in runs]
            print(f"{w:22} {e:11.4f} {i:9.4f} {m:9.4f} {min(e, i) / m:7.2f}x"
                  f" {min(per_round):6.2f}x {max(per_round):6.2f}x")
    print(f"\nruns kept in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
