"""``hmt profile-device`` on this machine: micro-benchmarks and the latency model's fit, from its --json summary.

Runs the command as a user would (``python -m commands profile-device ... --json``) and keeps
its summary: peak GEMM and 3x3-convolution rates, cache and DRAM read bandwidth, and the
latency model (the form chosen by cross-validated error, its R^2 and CV MAPE). With
``--supernet`` and ``--validate N``, the validation of the block-table sum against end-to-end
timings of N random variants (raw and composition-corrected) is kept too.

    python -m benchmarks.profile device --quick-profile          # the quick path, about a minute
    python -m benchmarks.profile device --supernet SUPERNET --validate 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, Driver, child_env


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    claims = [{"claim": "peak fp32 GEMM / 3x3 convolution (best kernel and thread count)",
               "figure": f"{report['benchmarks.peak_gemm_gmacs']:.1f} / {report['benchmarks.peak_conv_gmacs']:.1f} "
                         "GMAC/s"},
              {"claim": f"latency model ({report['latency_form']}), cross-validated MAPE on the probe layers",
               "figure": f"{report['models.latency.cv_mape'] * 100:.0f} %"}]
    if "validation.idle.mape" in report:
        claims.append({"claim": "block-table sum against end to end, idle: MAPE corrected (raw)",
                       "figure": f"{report['validation.idle.mape'] * 100:.1f} % "
                                 f"({report.get('validation.idle_raw.mape', float('nan')) * 100:.1f} %)"})
    return claims


BENCH = Driver(
    baseline="the printed eq. 2 form fitted on the same probe layers (the chosen form has the lower CV error); "
             "with --validate, the raw block-table sum beside the corrected one",
    quick=["--quick-profile", "--out", "{report}"],
    default=["--out", "{report}"],
    claims=_claims,
    timeout_s=1800,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick-profile", action="store_true", help="profile-device --quick")
    parser.add_argument("--supernet", type=Path, default=None)
    parser.add_argument("--validate", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="the summary (JSON)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hmt-bench-profile-") as tmp:
        cmd = [sys.executable, "-m", "commands", "profile-device", "--json", "--seed", str(args.seed),
               "--out", os.path.join(tmp, "profile")]
        if args.quick_profile:
            cmd.append("--quick")
        if args.supernet is not None:
            cmd += ["--supernet", str(args.supernet), "--validate", str(args.validate)]
        out = subprocess.run(cmd, cwd=REPO, env=child_env(), check=True, capture_output=True, text=True).stdout
    summary = json.loads(out)
    summary.pop("out", None)  # a temporary folder of this run
    args.out.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
