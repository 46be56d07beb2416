"""Compare pareto archives: the cheapest predicted latency within 1, 2, 3 and 5 points of the
largest variant's accuracy (the reference is the largest found in any of the archives).

    python -m benchmarks.pareto.compare_archives RUN_DIR [RUN_DIR ...]
"""

import sys

import pandas as pd


def main(dirs: list[str]) -> None:
    runs = {name: pd.read_csv(f"{name}/archive.csv") for name in dirs}
    rows = pd.concat(runs.values())
    largest = rows[rows.arch_id.str.fullmatch(r".*\.e\d+\.B+")].sort_values("exit_stage").iloc[-1]
    print(f"largest {largest.arch_id}: accuracy {largest.accuracy:.3f}, predicted {largest.latency_ms:.3f} ms")
    for name, df in runs.items():
        line = [name, f"best {df.accuracy.max():.3f}", f"evaluated {int(df.derived_from.isna().sum())}"]
        for points in (1, 2, 3, 5):
            ok = df[df.accuracy >= largest.accuracy - points / 100]
            if len(ok):
                r = ok.loc[ok.latency_ms.idxmin()]
                line.append(f"within {points}: {largest.latency_ms / r.latency_ms:.2f}x ({r.accuracy:.3f})")
            else:
                line.append(f"within {points}: none")
        print(" | ".join(line))


if __name__ == "__main__":
    main(sys.argv[1:])
