"""The hostile battery's checks: signature cases with roll-back, archives, a loaded .so overwritten, integrity and
kills, the soak."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.reliability.hostile_common import REPO, _written, http, npy, served
from benchmarks.reliability.integrity import Zeros

# -- signatures ---------------------------------------------------------------------------------------------


def _outcome(fn: Callable[[], Any]) -> str:
    from hmt.errors import HmtError

    try:
        fn()
        return "accepted"
    except HmtError as exc:
        return f"refused ({type(exc).__name__}: {str(exc)[-120:]})"


def bench_signatures(bundles: dict[str, Path], work: Path) -> dict[str, Any]:
    from hmt.artifacts import load_artifact
    from hmt.artifacts.rollback import RollbackPolicy
    from hmt.artifacts.signing import SIGNATURE_NAME, generate_key_pair, load_private_key, sign_artifact_dir
    from hmt.bundle import load_checked_bundle
    from hmt.offload.peer import PeerOptions
    from hmt.offload.server import open_peer

    private, public = bundles["private"], bundles["public"]
    _, foreign = generate_key_pair(work / "keys" / "foreign.pem")
    state = RollbackPolicy(state_dir=work / "state")

    def copy(name: str) -> Path:
        target = work / "sig" / name
        shutil.copytree(bundles["conv"], target)
        return target

    def sign(bundle: Path, version: int, created: str) -> Path:
        sign_artifact_dir(bundle, load_artifact(bundle, kind="bundle").manifest_sha256, load_private_key(private),
                          version=version, created_utc=created)
        return bundle

    unsigned = copy("unsigned")
    (unsigned / SIGNATURE_NAME).unlink()
    tampered = copy("tampered-version")
    doc = json.loads((tampered / SIGNATURE_NAME).read_text())
    doc["version"] = 99
    (tampered / SIGNATURE_NAME).write_text(json.dumps(doc))
    newer = sign(copy("v5"), 5, "2026-06-01T00:00:00+00:00")
    older = sign(copy("v4"), 4, "2026-07-01T00:00:00+00:00")
    same_earlier = sign(copy("v5-earlier"), 5, "2026-05-01T00:00:00+00:00")
    peer_service: list[Any] = []

    def peer_half() -> None:
        peer_service.append(open_peer(bundles["peer"], PeerOptions(), trusted_key=public, rollback=state))

    cases = [
        ("signed bundle, trusted key", "accepted", lambda: load_checked_bundle(bundles["conv"], trusted_key=public)),
        ("unsigned bundle, trusted key", "refused", lambda: load_checked_bundle(unsigned, trusted_key=public)),
        ("signed by another key", "refused", lambda: load_checked_bundle(bundles["conv"], trusted_key=foreign)),
        ("version changed in manifest.sig", "refused", lambda: load_checked_bundle(tampered, trusted_key=public)),
        ("device half of a signed bundle", "accepted",
         lambda: load_checked_bundle(bundles["device"], trusted_key=public)),
        ("peer half of a signed bundle (the peer)", "accepted", peer_half),
        ("version 5 served", "accepted", lambda: load_checked_bundle(newer, trusted_key=public, rollback=state)),
        ("then version 4 (roll-back)", "refused",
         lambda: load_checked_bundle(older, trusted_key=public, rollback=state)),
        ("then version 5 built earlier (roll-back)", "refused",
         lambda: load_checked_bundle(same_earlier, trusted_key=public, rollback=state)),
        ("then version 4 with --allow-rollback", "accepted",
         lambda: load_checked_bundle(older, trusted_key=public, rollback=RollbackPolicy(work / "state", allow=True))),
        ("then version 5 again", "accepted", lambda: load_checked_bundle(newer, trusted_key=public, rollback=state)),
    ]
    results = []
    for name, expected, fn in cases:
        got = _outcome(fn)
        results.append({"case": name, "expected": expected, "got": got, "as_expected": got.startswith(expected)})
    for service in peer_service:
        service.shutdown()
    # The CLI path: serve refuses the roll-back with exit 4.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "commands", "serve", str(older), "--port", "0", "--trusted-key",
                           str(public), "--state-dir", str(work / "state")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    results.append({"case": "hmt serve of version 4 after 5 (CLI)", "expected": "refused (exit 4)",
                    "got": f"exit {done.returncode}", "as_expected": done.returncode == 4})
    return {"cases": results, "as_expected": sum(r["as_expected"] for r in results), "total": len(results)}


# -- archives ---------------------------------------------------------------------------------------------


def bench_archives(bundles: dict[str, Path], work: Path, bomb_mib: int) -> dict[str, Any]:
    import hashlib
    import tarfile

    from hmt.artifacts.manifest import content_digest
    from hmt.artifacts.signing import load_public_key
    from hmt.deploy.archive import extract_archive, write_archive
    from hmt.errors import HmtError

    size = bomb_mib << 20
    manifest = json.loads((bundles["conv"] / "manifest.json").read_text())
    digest = hashlib.sha256()
    for _ in range(bomb_mib):
        digest.update(bytes(1 << 20))
    manifest["files"].append({"path": "variants/x/payload.so", "sha256": digest.hexdigest(), "size_bytes": size,
                              "media_type": "application/octet-stream"})
    manifest["content_sha256"] = content_digest(manifest)  # resealed: the bomb's maker would
    raw_manifest = json.dumps(manifest).encode()
    bomb = work / "listed-bomb.tar.gz"
    with open(bomb, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("bundle/manifest.json")
        info.size = len(raw_manifest)
        tar.addfile(info, io.BytesIO(raw_manifest))
        info = tarfile.TarInfo("bundle/variants/x/payload.so")
        info.size = size
        tar.addfile(info, io.BufferedReader(Zeros(size), buffer_size=1 << 20))
    out: dict[str, Any] = {"listed_bomb": {"archive_bytes": bomb.stat().st_size, "declared_bytes": size}}
    start = time.perf_counter()
    try:
        extract_archive(bomb, work / "bomb-dest")
        out["listed_bomb"]["outcome"] = "extracted"
    except HmtError as exc:
        out["listed_bomb"]["outcome"] = f"refused: {str(exc)[-160:]}"
    out["listed_bomb"]["seconds"] = round(time.perf_counter() - start, 3)
    out["listed_bomb"]["bytes_written"] = _written(work / "bomb-dest")
    key = load_public_key(bundles["public"])
    unsigned_dir = work / "arch-unsigned"
    shutil.copytree(bundles["conv"], unsigned_dir)
    (unsigned_dir / "manifest.sig").unlink()
    cases = {"signed archive, trusted key": write_archive(bundles["conv"], work / "signed.tar.gz"),
             "unsigned archive, trusted key": write_archive(unsigned_dir, work / "unsigned.tar.gz")}
    for name, archive in cases.items():
        dest = work / f"dest-{len(out)}"
        start = time.perf_counter()
        try:
            extract_archive(archive, dest, trusted_key=key)
            outcome = "extracted"
        except HmtError as exc:
            outcome = f"refused: {str(exc)[-120:]}"
        out[name] = {"outcome": outcome, "seconds": round(time.perf_counter() - start, 4),
                     "bytes_written_before_the_outcome": _written(dest)}
    return out


# -- a loaded library overwritten in place -------------------------------------------------------------------


def bench_library_swap(bundles: dict[str, Path], work: Path, seconds: float) -> dict[str, Any]:
    from hmt.runtime.tvm import tvm_available

    if "tvm" not in bundles or not tvm_available():
        return {"skipped": "the TVM runtime is not installed here"}
    bundle = work / "swap"
    shutil.copytree(bundles["tvm"], bundle)
    spec = json.loads((bundle / "bundle.json").read_text())
    shape = spec["input"]["shape"]
    body = npy(np.zeros(shape, np.float32))
    with served([str(bundle), "--engine", "tvm"]) as server:
        before = [http(server.port, "POST", "/v1/predict", body, {"content-type": "application/x-npy"})[0]
                  for _ in range(20)]
        libraries = sorted(bundle.rglob("*.so"))
        for library in libraries:  # in place, same inode: what cp over a file does
            with open(library, "r+b") as handle:
                handle.write(os.urandom(library.stat().st_size))
        after: list[int] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            after.append(http(server.port, "POST", "/v1/predict", body, {"content-type": "application/x-npy"})[0])
        alive = server.proc.poll() is None
        code = server.stop()
    return {"libraries_overwritten": len(libraries), "requests_before_ok": before.count(200),
            "requests_after": len(after), "requests_after_ok": after.count(200), "server_alive_after": alive,
            "exit_code": code, "exit_signal": -code if code is not None and code < 0 else None}


# -- kills and archives (scripts/bench_integrity.py), the soak (scripts/bench_http.py) ------------------------


def _script(args: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, *args, "--out", str(out)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        return {"failed": f"exit {done.returncode}: {done.stderr[-600:]}"}
    return dict(json.loads(out.read_text()))


def bench_integrity(work: Path, quick: bool) -> dict[str, Any]:
    doc = _script(["scripts/bench_integrity.py", "--bomb-mib", "96" if quick else "2100", "--repeats",
                   "2" if quick else "5", "--kills", "4" if quick else "14"], work / "integrity.json", 1800)
    doc.pop("machine", None)
    return doc


def bench_soak(bundles: dict[str, Path], work: Path, seconds: float, clients: int = 16) -> dict[str, Any]:
    doc = _script(["scripts/bench_http.py", "soak", str(bundles["soak"]), "--seconds", str(seconds), "--clients",
                   str(clients), "--rate-hz", "25", "--flip-s", "1"], work / "soak.json", seconds + 900)
    doc.pop("machine", None)
    doc.pop("bundle", None)
    return doc


