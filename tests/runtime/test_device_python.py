"""The device half runs on Python 3.8 (JetPack 5's): a static check with vermin over its files,
and, where a Python 3.8 with the device's packages is at hand, a real serve on it.

The files are the ones pyproject.toml pins to py38 for ruff ([tool.ruff.per-file-target-version]):
serve, the runtime, the client, the offload device side and what they import at run time.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]


def device_files() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = [p for p, v in config["tool"]["ruff"]["per-file-target-version"].items() if v == "py38"]
    files = sorted({f for p in patterns for f in glob.glob(str(REPO / p), recursive=True) if f.endswith(".py")})
    return files


def test_device_half_is_pinned_to_py38_and_covers_serve_runtime_client_offload() -> None:
    files = {str(Path(f).relative_to(REPO)) for f in device_files()}
    for required in ("hmt/client.py", "hmt/bundle.py", "hmt/runtime/variant.py", "hmt/runtime/ort.py",
                     "hmt/offload/device.py", "hmt/compat.py"):
        assert required in files
    assert any(f.startswith("hmt/serve/") for f in files)


def test_device_half_needs_no_newer_python_than_3_8() -> None:
    vermin = shutil.which("vermin")
    if vermin is None:
        pytest.skip("vermin not installed (pip install vermin; it is in the dev extra)")
    # --no-tips: no advice lines; --violations: only what breaks the target; '# novermin' marks a
    # line guarded by a version check (server.py's 3.11-only asyncio.Runner).
    done = subprocess.run([vermin, "--target=3.8-", "--no-tips", "--violations", "--backport", "typing_extensions",
                           *device_files()], capture_output=True, text=True, timeout=120)
    violations = [line for line in done.stdout.splitlines() if re.match(r"^\s*(!2, )?3\.\d+\s+/", line)
                  or "requires" in line]
    assert done.returncode == 0 and not violations, done.stdout[-3000:]


# What vermin does not see: a PEP 604 union (``list | tuple``) or a subscripted builtin (``list[int]``)
# evaluated when the code runs, not in an annotation (``from __future__ import annotations`` keeps those
# strings). On 3.8 they raise TypeError only on the line's first run: the uvicorn log then carried a
# traceback for every answered prediction (hmt.serve.http.guard's connection key).
_BUILTIN_TYPES = {"list", "tuple", "dict", "set", "frozenset", "type", "int", "float", "str", "bytes", "bool"}


def _runtime_typing_310(path: str) -> list[str]:
    import ast

    tree = ast.parse(Path(path).read_text(), filename=path)
    in_annotation: set[int] = set()
    for node in ast.walk(tree):
        annotations = [node.annotation] if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation else []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            annotations.append(node.returns)
        in_annotation.update(id(part) for annotation in annotations for part in ast.walk(annotation))

    def is_type(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in _BUILTIN_TYPES) or \
            (isinstance(node, ast.Constant) and node.value is None) or \
            (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and is_type(node.left))

    found = []
    for node in ast.walk(tree):
        if id(node) in in_annotation:
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and is_type(node.left) \
                and is_type(node.right):
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)} (a union evaluated at run time: 3.10+)")
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in _BUILTIN_TYPES:
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)} (a subscripted builtin at run time: 3.9+)")
    return found


def test_device_half_evaluates_no_3_10_typing_at_run_time() -> None:
    found = [line for f in device_files() for line in _runtime_typing_310(f)]
    assert not found, "\n".join(found)


PY38 = os.environ.get("HMT_PY38") or shutil.which("python3.8")


def _py38_ready() -> str | None:
    if PY38 is None:
        return "no python3.8 (set HMT_PY38 to a Python 3.8 with numpy, onnxruntime, starlette, uvicorn, psutil, " \
               "pillow, cryptography)"
    probe = subprocess.run([PY38, "-c", "import sys, numpy, onnxruntime, starlette, uvicorn, psutil, PIL, "
                            "cryptography; print(sys.version_info[:2])"], capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != "(3, 8)":
        return f"{PY38} is not a Python 3.8 with the device's packages: {probe.stderr.strip()[-200:]}"
    return None


@pytest.mark.slow
def test_bundle_serves_on_python_3_8(tmp_path: Path) -> None:
    reason = _py38_ready()
    if reason is not None:
        pytest.skip(reason)
    sys.path.insert(0, str(REPO / "tests" / "serve"))
    from serve_bundles import make_bundle, started_server

    from hmt.client import HmtClient

    bundle = make_bundle(tmp_path / "bundle")
    assert PY38 is not None
    # As a JetPack 5 user starts it: hmt serve (the console script runs commands.entry, as -m commands does).
    proc, lines, url = started_server([PY38, "-m", "commands", "serve", str(bundle), "--port", "0"], cwd=REPO,
                                      env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        with HmtClient(url) as client:
            answer = client.predict(np.zeros((1, 4), np.float32))
            assert answer["variant"] in {"big", "small"} and 0 <= answer["confidence"] <= 1
            assert client.status()["requests"] == 1
    finally:
        proc.terminate()
        code = proc.wait(30)
    assert code == 0, "".join(lines)[-3000:]  # SIGTERM drains and stops
    assert any(line.startswith("stopped after 1 requests") for line in lines), "".join(lines)[-3000:]
    # An answered request logs nothing on 3.8 (a TypeError after the body was sent went to the log).
    assert "Traceback" not in "".join(lines), "".join(lines)[-3000:]


SILENT_PEER_38 = """
import socket, threading
from hmt.offload.client import PeerClient, PeerFailure
server = socket.create_server(("127.0.0.1", 0))
def accept():
    conn, _ = server.accept()
    conn.recv(65536)
    threading.Event().wait(5)  # reads the request, never answers
threading.Thread(target=accept, daemon=True).start()
try:
    PeerClient("http://127.0.0.1:%d" % server.getsockname()[1]).status(limit_ms=200.0)
except PeerFailure as exc:
    print(exc.reason)
"""


def test_a_silent_peer_is_a_timeout_on_python_3_8() -> None:
    # Before 3.10, socket.timeout is an OSError but no TimeoutError: the device counted a peer that
    # did not answer in time as "broken" (peer_errors in /v1/status, the answer's peer_error).
    reason = _py38_ready()
    if reason is not None:
        pytest.skip(reason)
    assert PY38 is not None
    done = subprocess.run([PY38, "-c", SILENT_PEER_38], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "timeout", done.stdout


def test_compat_stand_ins_behave_like_the_builtins() -> None:
    from hmt.compat import _strict_zip_38, pairwise, strict_zip

    for zipper in (strict_zip, _strict_zip_38):
        assert list(zipper([1, 2], "ab")) == [(1, "a"), (2, "b")]
        assert list(zipper()) == []
        for a, b in (([1, 2], [3]), ([1], [3, 4])):
            with pytest.raises(ValueError):
                list(zipper(a, b))
    assert list(pairwise([1, 2, 3])) == [(1, 2), (2, 3)]
    assert list(pairwise([1])) == []
