"""Peer timings for the .pt2 cases (`minductor bench --pt2`): PyTorch eager vs torch.compile (Inductor
CPU) on the same saved programs and the same stored inputs.
Usage: python pt2_suite.py [DIR] [--threads N] [--only NAME] [--no-freezing] > out.jsonl
DIR is the folder of manifest.json (default $MINDUCTOR_EXPORTED_DIR, else ../shared/exported beside
the repository, as `minductor bench --pt2` finds it).
Each line: {"workload","threads","eager_ms","inductor_ms","compile_s","freezing"}, the schema of
../shared/peers/torch_suite.py, so its side_by_side.py reads it unchanged. Timing is that script's:
median of timed calls after warm-up, at least 5 calls and about 0.5 s.
Each case is loaded with torch.export.load and run as ep.module(): eager, and under torch.compile
(Inductor; by default with `freezing`, Inductor's inference mode that folds the weights as constants,
as minductor's compile freezes them). Inductor compiles into a fresh cache folder every run (its
kernels fix their OpenMP thread count at compile time)."""
import os, tempfile
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="pt2_suite_")
import argparse, json, pathlib, time, torch
from safetensors.torch import load_file

def median_ms(f, args, min_time=0.5, max_iters=200):
    for _ in range(3): f(*args)
    ts = []; start = time.perf_counter()
    while len(ts) < 5 or (time.perf_counter() - start < min_time and len(ts) < max_iters):
        t = time.perf_counter(); f(*args); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2] * 1e3

if __name__ == "__main__":
    default_dir = os.environ.get("MINDUCTOR_EXPORTED_DIR") or \
        pathlib.Path(__file__).resolve().parents[2] / ".." / "shared" / "exported"
    ap = argparse.ArgumentParser(); ap.add_argument("dir", nargs="?", default=str(default_dir))
    ap.add_argument("--threads", type=int); ap.add_argument("--only")
    ap.add_argument("--no-freezing", action="store_true", help="compile without Inductor's freezing")
    a = ap.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    freezing = not a.no_freezing
    torch._inductor.config.freezing = freezing
    root = pathlib.Path(a.dir)
    manifest = json.loads((root / "manifest.json").read_text())
    for case in manifest["cases"]:
        name = case["name"]
        if a.only and a.only not in name: continue
        module = torch.export.load(str(root / case["file"])).module()
        data = load_file(str(root / case["data"]))
        args = tuple(data[i["name"]] for i in case["inputs"])
        with torch.no_grad():
            eager = median_ms(module, args)
            torch._dynamo.reset(); cf = torch.compile(module)
            t0 = time.perf_counter(); cf(*args); compile_s = time.perf_counter() - t0
            ind = median_ms(cf, args)
        print(json.dumps({"workload": name, "threads": torch.get_num_threads(), "eager_ms": round(eager, 4),
                          "inductor_ms": round(ind, 4), "compile_s": round(compile_s, 3),
                          "freezing": freezing}), flush=True)
