"""Merge the per-variant bench_precision JSON into one file and print the README table."""
import glob, json, sys
files = sorted(glob.glob("runs/int8-r56/v*.json"), key=lambda f: int(f.split("/v")[-1].split(".")[0]))
runs = [json.load(open(f)) for f in files]
out = {"note": "one bench_precision.py run per variant, each under flock /tmp/hmt-bench.lock (benchmarks/precision/run_int8_r56.sh)",
       "runs": runs}
json.dump(out, open(sys.argv[1], "w"), indent=1)
print("| variant | fp32 % | int8 % | loss (points) | merged 1 thr: fp32 / int8 ms | int8 speed-up merged 1 thr / 2 thr | per graph 1 / 2 thr | without padding: merged 1 / 2 thr |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for r in runs:
    v = r["variants"][0]
    f, q = v["fp32"]["accuracy_per_exit"][-1], v["int8"]["accuracy_per_exit"][-1]
    m1, m2 = v["latency[merged,threads=1]"], v["latency[merged,threads=default]"]
    p1, p2 = v["latency[per_graph,threads=1]"], v["latency[per_graph,threads=default]"]
    print(f"| `{v['arch_id'].split('.', 1)[1]}` | {100*f:.2f} | {100*q:.2f} | {100*(f-q):+.2f} | "
          f"{m1['fp32']['median_ms']:.3f} / {m1['int8']['median_ms']:.3f} | **{m1['speedup_int8']:.2f}** / {m2['speedup_int8']:.2f} | "
          f"{p1['speedup_int8']:.2f} / {p2['speedup_int8']:.2f} | {m1['speedup_int8_unpadded']:.2f} / {m2['speedup_int8_unpadded']:.2f} |"
          f" load {r['machine']['load_avg_start'][0]:.1f}->{r['machine']['load_avg_end'][0]:.1f}")
