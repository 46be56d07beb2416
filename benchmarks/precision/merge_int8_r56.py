"""Merge the per-variant bench_precision JSON (run_int8_r56.sh) into one file and print the README table.

    python3 benchmarks/precision/merge_int8_r56.py benchmarks/precision/int8_r56_cpu.json
"""

import glob
import json
import sys
from pathlib import Path


def main() -> int:
    files = sorted(glob.glob("runs/int8-r56/v*.json"), key=lambda f: int(f.split("/v")[-1].split(".")[0]))
    runs = [json.loads(Path(f).read_text()) for f in files]
    Path(sys.argv[1]).write_text(json.dumps(
        {"note": "one bench_precision.py run per variant, each under flock /tmp/hmt-bench.lock "
                 "(benchmarks/precision/run_int8_r56.sh)", "runs": runs}, indent=1) + "\n")
    print("| variant | fp32 % | int8 % | loss (points) | merged 1 thr: fp32 / int8 ms "
          "| int8 speed-up merged 1 thr / 2 thr | per graph 1 / 2 thr | without padding: merged 1 / 2 thr "
          "| load start -> end |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        v = r["variants"][0]
        f, q = v["fp32"]["accuracy_per_exit"][-1], v["int8"]["accuracy_per_exit"][-1]
        m1, m2 = v["latency[merged,threads=1]"], v["latency[merged,threads=default]"]
        p1, p2 = v["latency[per_graph,threads=1]"], v["latency[per_graph,threads=default]"]
        load = r["machine"]
        print(f"| `{v['arch_id'].split('.', 1)[1]}` | {100 * f:.2f} | {100 * q:.2f} | {100 * (f - q):+.2f} "
              f"| {m1['fp32']['median_ms']:.3f} / {m1['int8']['median_ms']:.3f} "
              f"| **{m1['speedup_int8']:.2f}** / {m2['speedup_int8']:.2f} "
              f"| {p1['speedup_int8']:.2f} / {p2['speedup_int8']:.2f} "
              f"| {m1['speedup_int8_unpadded']:.2f} / {m2['speedup_int8_unpadded']:.2f} "
              f"| {load['load_avg_start'][0]:.1f} -> {load['load_avg_end'][0]:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
