"""Integrity benchmark (issue 17 items 4, 5, 7, 8): archive bombs, structural checks, kill debris.

Measures, on this machine, with the baseline in the same run:

1. bomb: a gzip'd tar of a tiny real bundle's manifest plus ``--bomb-mib`` MiB of zeros.
   Baseline: the standard library's ``tarfile.extractall(filter="data")`` (refuses links and
   escaping paths, like hmt's extractor before, but no sizes; ``--baseline-bomb`` runs it,
   writing the whole expansion to a temporary folder, then deletes it). hmt: time to the
   refusal and bytes written.
2. real bundle archive: extraction time, stdlib ``extractall(filter="data")`` vs hmt's bounded
   extraction (medians of ``--repeats``).
3. serve start-up: ``load_bundle`` alone vs ``load_checked_bundle`` (the structural checks
   serve now runs), and with a signature checked (medians).
4. kill debris: ``--kills`` writers of the same output each SIGKILLed after a random delay,
   the debris they leave, then one successful write and the debris after it.

The bundle is built here from tests/deploy's tiny segmented model (convert, fuse, a hand-made
front, deploy for x86-64 with TVM): about 15 s.

    PYTHONPATH=$PWD python -m benchmarks.reliability.integrity --out benchmarks/integrity/integrity.json
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver

REPO = Path(__file__).resolve().parents[2]


class Zeros(io.RawIOBase):
    """``size`` zero bytes, read without holding them (archive-bomb payloads)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _build_bundle(work: Path) -> Path:
    from hmt.convert import TorchSource, convert_model
    from hmt.deploy import DeployOptions, deploy_bundle
    from hmt.fuse import FuseOptions, fuse_model

    spec = importlib.util.spec_from_file_location("deploy_conftest", REPO / "tests" / "deploy" / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    work.mkdir(parents=True, exist_ok=True)
    (work / "seg.py").write_text(conftest._segmented_source())
    convert_model(TorchSource(f"{work / 'seg.py'}:segmented", ((1, 3, 16, 16),)), work / "converted")
    fuse_model(work / "converted", work / "fused", options=FuseOptions(engines=("ort",), repeats=2, warmup=1))
    report = json.loads((work / "fused" / "report.json").read_text())
    arch_id = str(report["variants"][0].get("arch_id") or report["variants"][0]["name"])
    conftest.make_pareto(work / "pareto", [conftest.point(arch_id)])
    out = work / "bundle"
    deploy_bundle(work / "fused", work / "pareto", out, options=DeployOptions(target="x86-64", latency_ms=5.0))
    return out


def _bomb(bundle: Path, path: Path, size: int) -> Path:
    manifest = (bundle / "manifest.json").read_bytes()
    with open(path, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
        info = tarfile.TarInfo("bundle/manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        info = tarfile.TarInfo("bundle/variants/x/payload.so")
        info.size = size
        tar.addfile(info, io.BufferedReader(Zeros(size), buffer_size=1 << 20))
    return path


def _stdlib_extract(archive: Path, dest: Path) -> None:
    with tarfile.open(archive, "r:*") as tar:
        tar.extractall(dest, filter="data")


def _median_s(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_bomb(bundle: Path, work: Path, mib: int, baseline: bool, repeats: int) -> dict[str, Any]:
    from hmt.deploy.archive import extract_archive
    from hmt.errors import ArtifactError

    start = time.perf_counter()
    archive = _bomb(bundle, work / "bomb.tar.gz", mib << 20)
    result: dict[str, Any] = {"archive_bytes": archive.stat().st_size, "declared_bytes": mib << 20,
                              "generate_s": round(time.perf_counter() - start, 2)}
    refusals = []
    for i in range(repeats):
        dest = work / f"hmt-{i}"
        start = time.perf_counter()
        try:
            extract_archive(archive, dest)
            refused = ""
        except ArtifactError as exc:
            refused = str(exc)
        refusals.append((time.perf_counter() - start, _du(dest), refused))
        shutil.rmtree(dest, ignore_errors=True)
    result["hmt"] = {"refused": all(r[2] for r in refusals), "message": refusals[0][2][:300],
                     "median_s": round(statistics.median(r[0] for r in refusals), 4),
                     "max_written_bytes": max(r[1] for r in refusals)}
    if baseline:
        dest = work / "stdlib"
        start = time.perf_counter()
        _stdlib_extract(archive, dest)
        result["stdlib_data_filter"] = {"refused": False, "s": round(time.perf_counter() - start, 2),
                                        "written_bytes": _du(dest)}
        shutil.rmtree(dest, ignore_errors=True)
    archive.unlink()
    return result


def bench_archive(bundle: Path, work: Path, repeats: int) -> dict[str, Any]:
    from hmt.deploy.archive import archive_path_for, extract_archive

    archive = archive_path_for(bundle)
    counter = iter(range(10**6))

    def ours() -> None:
        extract_archive(archive, work / f"a{next(counter)}")

    def stdlib() -> None:
        _stdlib_extract(archive, work / f"b{next(counter)}")

    # Interleaved, so both see the same load on a shared machine.
    ours_s, std_s = [], []
    for _ in range(repeats):
        ours_s.append(_median_s(ours, 1))
        std_s.append(_median_s(stdlib, 1))
    return {"archive_bytes": archive.stat().st_size, "bundle_bytes": _du(bundle),
            "hmt_median_s": round(statistics.median(ours_s), 4), "stdlib_median_s": round(statistics.median(std_s), 4),
            "ratio": round(statistics.median(ours_s) / statistics.median(std_s), 3)}


def bench_startup(bundle: Path, work: Path, repeats: int) -> dict[str, Any]:
    from hmt.artifacts.signing import generate_key_pair, load_private_key, sign_artifact_dir
    from hmt.artifacts.store import load_artifact
    from hmt.bundle import load_bundle, load_checked_bundle

    signed = work / "signed"
    shutil.copytree(bundle, signed)
    private, public = generate_key_pair(work / "keys" / "k.pem")
    sign_artifact_dir(signed, load_artifact(signed, kind="bundle").manifest_sha256, load_private_key(private))
    plain, checked, with_key = [], [], []
    calls = 10  # each sample is the mean of 10 calls: single calls of ~2 ms are noise on a shared CPU
    load_checked_bundle(signed, trusted_key=public)  # imports (cryptography, settings) out of the timing
    for _ in range(repeats):
        plain.append(_median_s(lambda: [load_bundle(bundle) for _ in range(calls)], 1) / calls)
        checked.append(_median_s(lambda: [load_checked_bundle(bundle) for _ in range(calls)], 1) / calls)
        with_key.append(_median_s(lambda: [load_checked_bundle(signed, trusted_key=public)
                                           for _ in range(calls)], 1) / calls)
    med = [statistics.median(x) * 1e3 for x in (plain, checked, with_key)]
    return {"load_bundle_ms": round(med[0], 2), "load_checked_bundle_ms": round(med[1], 2),
            "with_signature_ms": round(med[2], 2), "files": len(load_bundle(bundle).artifact.manifest.files)}


_KILLED = textwrap.dedent("""
    import sys
    from hmt.artifacts import ArtifactWriter
    with ArtifactWriter(sys.argv[1], kind="demo", config={}) as w:
        for i in range(64):
            w.write_bytes(f"part{i}.bin", bytes(256 << 10))
""")


def bench_debris(work: Path, kills: int, seed: int) -> dict[str, Any]:
    from hmt.artifacts import ArtifactWriter

    rng = random.Random(seed)
    out = work / "debris" / "art"
    out.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # How long one unkilled write takes, so the kills land anywhere inside it.
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", _KILLED, str(out)], env=env, check=True, timeout=300)
    full_s = time.perf_counter() - start
    killed = 0
    for _ in range(kills):
        proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(out)], env=env)
        time.sleep(rng.uniform(0.3, 1.0) * full_s)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait(timeout=60)
    hidden = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    with ArtifactWriter(out, kind="demo", config={}) as writer:
        writer.write_bytes("x.bin", b"x")
    after = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    return {"unkilled_write_s": round(full_s, 2), "runs": kills, "killed_mid_write": killed,
            "debris_before": len(hidden), "debris_after_next_write": len(after)}


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    bomb, startup = report["bomb"], report["serve_startup"]
    claims = [{"claim": f"archive bomb ({bomb['declared_bytes'] / 2**20:,.0f} MiB declared) refused before extracting",
               "figure": f"{bomb['hmt']['median_s'] * 1e3:.1f} ms, {bomb['hmt']['max_written_bytes']} bytes written"},
              {"claim": "serve start-up with the structural checks against load_bundle alone",
               "figure": f"{startup['load_checked_bundle_ms']:.1f} ms against {startup['load_bundle_ms']:.1f} ms"}]
    debris = report.get("kill_debris")
    if debris:
        claims.append({"claim": f"debris left by {debris['runs']} writers killed mid-write, after the next write",
                       "figure": f"{debris['debris_after_next_write']} files (before it: {debris['debris_before']})"})
    return claims


BENCH = Driver(
    baseline="the standard library's tarfile.extractall(filter='data') and load_bundle without checks, "
             "in the same run",
    quick=["--bomb-mib", "8", "--repeats", "3", "--kills", "3", "--out", "{report}"],
    default=["--out", "{report}"],
    claims=_claims,
    timeout_s=1800,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bomb-mib", type=int, default=2100, help="Zeros in the bomb (MiB); the issue's was 2.1 GB.")
    parser.add_argument("--baseline-bomb", action="store_true",
                        help="Also extract the bomb with the stdlib (writes --bomb-mib MiB, then deletes it).")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hmt-bench-integrity-") as tmp:
        work = Path(tmp)
        bundle = _build_bundle(work / "build")
        result = {
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                        "note": "shared with other jobs"},
            "bomb": bench_bomb(bundle, work, args.bomb_mib, args.baseline_bomb, args.repeats),
            "archive_extraction": bench_archive(bundle, work, args.repeats),
            "serve_startup": bench_startup(bundle, work, args.repeats),
            "kill_debris": bench_debris(work, args.kills, args.seed),
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
