"""The hostile battery's attacks: hostile requests to the server and the peer, slow sockets, decode floods."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.reliability.hostile_common import http, median, npy, npy_claiming, png, served, tally
from benchmarks.reliability.http_layer import slow_sockets

# -- hostile requests ---------------------------------------------------------------------------------


def server_cases() -> list[tuple[str, str, str, bytes | None, dict[str, str]]]:
    """(name, method, path, body, headers) of hostile requests to POST /v1/predict and around it."""
    npy_h = {"content-type": "application/x-npy"}
    json_h = {"content-type": "application/json"}
    good = np.zeros((1, 3, 8, 8), np.float32)
    cases: list[tuple[str, str, str, bytes | None, dict[str, str]]] = [
        ("npy 3e38", "POST", "/v1/predict", npy(np.full((1, 3, 8, 8), 3e38, np.float32)), npy_h),
        ("npy -3e38", "POST", "/v1/predict", npy(np.full((1, 3, 8, 8), -3e38, np.float32)), npy_h),
        ("npy nan", "POST", "/v1/predict", npy(np.full((1, 3, 8, 8), np.nan, np.float32)), npy_h),
        ("npy inf", "POST", "/v1/predict", npy(np.full((1, 3, 8, 8), np.inf, np.float32)), npy_h),
        ("npy float64 1e300", "POST", "/v1/predict", npy(np.full((1, 3, 8, 8), 1e300)), npy_h),
        ("npy wrong shape", "POST", "/v1/predict", npy(np.zeros((1, 3, 9, 8), np.float32)), npy_h),
        ("npy header claims 8 GiB", "POST", "/v1/predict", npy_claiming((1 << 31, 1), b"\0" * 16), npy_h),
        ("npy header claims 1e12 x 1e12", "POST", "/v1/predict", npy_claiming((10**12, 10**12), b""), npy_h),
        ("npy object dtype", "POST", "/v1/predict", npy_claiming((1,), b"\0" * 8, "|O"), npy_h),
        ("npy structured dtype", "POST", "/v1/predict", npy_claiming((1,), b"\0" * 8, "[('a', '<f4')]"), npy_h),
        ("npy truncated", "POST", "/v1/predict", npy(good)[:-10], npy_h),
        ("npy trailing bytes", "POST", "/v1/predict", npy(good) + b"\0" * 64, npy_h),
        ("npy no magic", "POST", "/v1/predict", b"\0" * 900, npy_h),
        ("npz", "POST", "/v1/predict", b"PK\x03\x04" + b"\0" * 100, npy_h),
        ("pickle", "POST", "/v1/predict", b"\x80\x04\x95" + b"\0" * 64, {"content-type": "application/octet-stream"}),
        ("npy batch 10000", "POST", "/v1/predict", npy(np.zeros((10000, 3, 8, 8), np.float32)), npy_h),
        ("json NaN", "POST", "/v1/predict", b'{"inputs": [NaN]}', json_h),
        ("json Infinity", "POST", "/v1/predict", b'{"inputs": [Infinity]}', json_h),
        ("json 1e999", "POST", "/v1/predict", b'{"inputs": [1e999]}', json_h),
        ("json huge int", "POST", "/v1/predict", b'{"inputs": [' + b"9" * 5000 + b"]}", json_h),
        ("json 3e38", "POST", "/v1/predict", json.dumps({"inputs": [3e38] * 192}).encode(), json_h),
        ("json deep nesting", "POST", "/v1/predict", b'{"inputs": ' + b"[" * 100000 + b"]" * 100000 + b"}", json_h),
        ("json strings", "POST", "/v1/predict", json.dumps({"inputs": ["a"] * 192}).encode(), json_h),
        ("json not an object", "POST", "/v1/predict", b"[1, 2, 3]", json_h),
        ("json malformed", "POST", "/v1/predict", b'{"inputs": [1, 2', json_h),
        ("json wrong count", "POST", "/v1/predict", json.dumps({"inputs": [0.0] * 191}).encode(), json_h),
        ("json invalid utf-8", "POST", "/v1/predict", b'{"inputs": "\xff\xfe"}', json_h),
        ("png 4000x4000", "POST", "/v1/predict", png(4000, 4000), {"content-type": "image/png"}),
        ("png 30000x30000 header", "POST", "/v1/predict", _png_header(30000, 30000), {"content-type": "image/png"}),
        ("png truncated", "POST", "/v1/predict", png(64, 64)[:40], {"content-type": "image/png"}),
        ("jpeg garbage", "POST", "/v1/predict", b"\xff\xd8\xff" + b"\0" * 200, {"content-type": "image/jpeg"}),
        ("gif", "POST", "/v1/predict", b"GIF89a" + b"\0" * 50, {"content-type": "image/gif"}),
        ("no content-type", "POST", "/v1/predict", npy(good), {}),
        ("text/plain", "POST", "/v1/predict", b"hello", {"content-type": "text/plain"}),
        ("empty body", "POST", "/v1/predict", b"", npy_h),
        ("body over the limit", "POST", "/v1/predict", b"\0" * (9 << 20), npy_h),
        ("content-length 1e15", "POST", "/v1/predict", None, npy_h | {"content-length": "1000000000000000"}),
        ("deadline -1", "POST", "/v1/predict", npy(good), npy_h | {"x-deadline-ms": "-1"}),
        ("deadline nan", "POST", "/v1/predict", npy(good), npy_h | {"x-deadline-ms": "nan"}),
        ("deadline 1e308", "POST", "/v1/predict", npy(good), npy_h | {"x-deadline-ms": "1e308"}),
        ("deadline text", "POST", "/v1/predict", npy(good), npy_h | {"x-deadline-ms": "soon"}),
        ("client latency nan", "POST", "/v1/predict", npy(good), npy_h | {"x-hmt-client-latency-ms": "nan"}),
        ("client latency -5", "POST", "/v1/predict", npy(good), npy_h | {"x-hmt-client-latency-ms": "-5"}),
        ("GET predict", "GET", "/v1/predict", None, {}),
        ("DELETE status", "DELETE", "/v1/status", None, {}),
        ("unknown path", "GET", "/v1/../../etc/passwd", None, {}),
        ("unknown path 2", "GET", "/admin", None, {}),
        ("POST metrics", "POST", "/metrics", b"x", {}),
    ]
    return cases


def _png_header(width: int, height: int) -> bytes:
    """A PNG signature and IHDR claiming ``width`` x ``height`` (no image data)."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))


def peer_cases() -> list[tuple[str, str, str, bytes | None, dict[str, str]]]:
    seg = "/v1/segment?variant=deep&cut=1"
    shape = {"x-hmt-shape": "1,4,4,4"}
    f32 = {"x-hmt-codec": "float32"} | shape
    int8 = {"x-hmt-codec": "int8"} | shape

    def full(value: float) -> bytes:
        return np.full(64, value, np.float32).tobytes()

    return [
        ("3e38", "POST", seg, full(3e38), f32),
        ("-3e38", "POST", seg, full(-3e38), f32),
        ("1e30", "POST", seg, full(1e30), f32),
        ("nan", "POST", seg, full(np.nan), f32),
        ("inf", "POST", seg, full(np.inf), f32),
        ("-inf", "POST", seg, full(-np.inf), f32),
        ("float16 inf", "POST", seg, np.full(64, np.inf, np.float16).tobytes(), {"x-hmt-codec": "float16"} | shape),
        ("int8 scale 1e38", "POST", seg, np.ones(64, np.int8).tobytes(), int8 | {"x-hmt-scale": "1e38"}),
        ("int8 scale 3e36", "POST", seg, np.ones(64, np.int8).tobytes(), int8 | {"x-hmt-scale": "3e36"}),
        ("int8 scale 1e36", "POST", seg, np.full(64, 127, np.int8).tobytes(), int8 | {"x-hmt-scale": "1e36"}),
        ("int8 scale inf", "POST", seg, np.ones(64, np.int8).tobytes(), int8 | {"x-hmt-scale": "inf"}),
        ("int8 scale nan", "POST", seg, np.ones(64, np.int8).tobytes(), int8 | {"x-hmt-scale": "nan"}),
        ("int8 scale -1", "POST", seg, np.ones(64, np.int8).tobytes(), int8 | {"x-hmt-scale": "-1"}),
        ("int8 no scale", "POST", seg, np.ones(64, np.int8).tobytes(), int8),
        ("codec bogus", "POST", seg, full(0.0), {"x-hmt-codec": "bfloat99"} | shape),
        ("shape mismatch", "POST", seg, full(0.0), {"x-hmt-shape": "1,8,2,4"}),
        ("shape huge", "POST", seg, full(0.0), {"x-hmt-shape": "100000,100000,100000"}),
        ("shape negative", "POST", seg, full(0.0), {"x-hmt-shape": "1,-4,4,4"}),
        ("shape text", "POST", seg, full(0.0), {"x-hmt-shape": "a,b"}),
        ("no shape", "POST", seg, full(0.0), {}),
        ("body short", "POST", seg, full(0.0)[:-4], f32),
        ("body long", "POST", seg, full(0.0) + b"\0" * 4, f32),
        ("body over the limit", "POST", seg, b"\0" * (1 << 20), f32),
        ("content-length 1e15", "POST", seg, None, f32 | {"content-length": "1000000000000000"}),
        ("unknown variant", "POST", "/v1/segment?variant=nope&cut=1", full(0.0), f32),
        ("cut 99", "POST", "/v1/segment?variant=deep&cut=99", full(0.0), f32),
        ("cut -1", "POST", "/v1/segment?variant=deep&cut=-1", full(0.0), f32),
        ("cut text", "POST", "/v1/segment?variant=deep&cut=x", full(0.0), f32),
        ("deadline -1", "POST", seg, full(0.0), f32 | {"x-deadline-ms": "-1"}),
        ("deadline nan", "POST", seg, full(0.0), f32 | {"x-deadline-ms": "nan"}),
        ("confidence 2", "POST", seg, full(0.0), f32 | {"x-hmt-confidence": "2"}),
        ("confidence inf", "POST", seg, full(0.0), f32 | {"x-hmt-confidence": "inf"}),
        ("probe over the limit", "POST", "/v1/probe", b"\0" * (2 << 20), {}),
        ("GET segment", "GET", seg, None, {}),
        ("unknown path", "GET", "/admin", None, {}),
    ]


def run_cases(port: int, cases: list[tuple[str, str, str, bytes | None, dict[str, str]]]) -> dict[str, Any]:
    outcomes = []
    for name, method, path, body, headers in cases:
        status, data, _ = http(port, method, path, body, headers)
        outcomes.append((name, status, data))
    alive, _, _ = http(port, "GET", "/v1/health/live")
    return tally(outcomes) | {"alive_after": alive == 200}


def bench_requests(bundles: dict[str, Path]) -> dict[str, Any]:
    with served([str(bundles["conv"])]) as server:
        main = run_cases(server.port, server_cases())
    with served([str(bundles["peer"]), "--role", "peer"]) as peer:
        side = run_cases(peer.port, peer_cases())
    return {"server_requests": main, "peer_requests": side}


# -- slow sockets ---------------------------------------------------------------------------------------


def _slowloris(port: int, sockets: int, stop: threading.Event, stats: Counter[str]) -> None:
    """``sockets`` connections to the peer's route: a header line every 2 s; reconnect when cut."""
    slow_sockets(port, sockets, stop, stats, path="/v1/segment", interval_s=2.0)


def _probe(port: int, seconds: float) -> list[tuple[int, float]]:
    results = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        status, _, ms = http(port, "GET", "/v1/health/live", timeout_s=3.0)
        results.append((status, ms))
        time.sleep(0.2)
    return results


def _probe_summary(results: list[tuple[int, float]]) -> dict[str, Any]:
    ok = [ms for status, ms in results if status == 200]
    return {"probes": len(results), "ok": len(ok), "ok_share": round(len(ok) / max(1, len(results)), 4),
            "ok_p50_ms": median(ok), "ok_max_ms": round(max(ok), 2) if ok else None}


def bench_slow_sockets(bundles: dict[str, Path], sockets: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"sockets": sockets, "seconds": seconds, "fd_limit": 1024}
    for name, args in (("peer", [str(bundles["peer"]), "--role", "peer"]), ("server", [str(bundles["conv"])])):
        with served(args, fd_limit=1024) as server:
            baseline = _probe_summary(_probe(server.port, 2.0))
            stop = threading.Event()
            stats: Counter[str] = Counter()
            log_before = server.log_bytes
            attack = threading.Thread(target=_slowloris, args=(server.port, sockets, stop, stats), daemon=True)
            attack.start()
            time.sleep(min(3.0, seconds / 4))  # the sockets are open
            under = _probe_summary(_probe(server.port, seconds))
            stop.set()
            attack.join(30)
            status, body, _ = http(server.port, "GET", "/v1/status")
            doc = json.loads(body) if status == 200 else {}
            connections = doc.get("connections") or doc.get("http", {}).get("connections")
            out[name] = {"baseline_probe": baseline, "under_attack_probe": under, "attacker": dict(stats),
                         "log_bytes_during_attack": server.log_bytes - log_before, "connections": connections}
            start = time.monotonic()
            server.stop()
            out[name]["sigterm_s"] = round(time.monotonic() - start, 2)
    return out


# -- decoding off the event loop -------------------------------------------------------------------------


def _flood(port: int, body: bytes, headers: dict[str, str], stop: threading.Event, counts: Counter[int]) -> None:
    while not stop.is_set():
        status, _, _ = http(port, "POST", "/v1/predict", body, headers, timeout_s=30)
        counts[status] += 1


def _unrelated(port: int, seconds: float) -> list[float]:
    body = npy(np.zeros((1, 3, 8, 8), np.float32))
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        status, _, ms = http(port, "POST", "/v1/predict", body, {"content-type": "application/x-npy"}, timeout_s=30)
        if status == 200:
            out.append(ms)
        time.sleep(0.05)
    return out


def bench_decode(bundles: dict[str, Path], seconds: float) -> dict[str, Any]:
    image = png(4000, 4000)
    payload = json.dumps({"inputs": [[0.123456789] * 192] * 680}).encode()  # ~1 MiB, a batch over the limit
    out: dict[str, Any] = {"png_bytes": len(image), "json_bytes": len(payload), "flood_clients": 8}
    with served([str(bundles["conv"]), "--max-body-kb", "2048"]) as server:
        out["unrelated_p50_ms_alone"] = median(_unrelated(server.port, seconds))
        for name, body, media in (("png", image, "image/png"), ("json", payload, "application/json")):
            stop = threading.Event()
            counts: Counter[int] = Counter()
            threads = [threading.Thread(target=_flood, args=(server.port, body, {"content-type": media}, stop,
                                                             counts), daemon=True) for _ in range(8)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            latencies = _unrelated(server.port, seconds)
            stop.set()
            for t in threads:
                t.join(60)
            out[f"unrelated_p50_ms_under_{name}"] = median(latencies)
            out[f"unrelated_answered_under_{name}"] = len(latencies)
            out[f"{name}_flood_statuses"] = {str(k): v for k, v in sorted(counts.items())}
    return out


