"""scripts/setup_torch.sh asks PyTorch's CPU index for torch, falls back to the default index
where that is unreachable, and says which build is installed (read from the installed torch)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, index: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    # A stand-in for pip that records its arguments: the test installs nothing.
    log = tmp_path / "pip.log"
    fake = tmp_path / "fake_pip.py"
    fake.write_text(f"import sys\nopen({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n")
    done = subprocess.run(["bash", str(REPO / "scripts" / "setup_torch.sh")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HMT_PIP": f"{sys.executable} {fake}",
                                            "HMT_TORCH_CPU_INDEX": index})
    return done, log.read_text().splitlines() if log.exists() else []


def _expected_build() -> str:
    import torch

    return "CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} build"


def test_unreachable_cpu_index_falls_back_to_the_default(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, "http://127.0.0.1:9/whl/cpu")  # port 9 (discard): refused
    assert done.returncode == 0, done.stderr
    assert calls == ["install --quiet --disable-pip-version-check --root-user-action=ignore torch==2.13.0"]
    assert "is not reachable" in done.stderr
    import torch

    assert f"setup: torch {torch.__version__} installed, {_expected_build()}, from the default index" in done.stdout


def test_reachable_cpu_index_is_asked_explicitly(tmp_path: Path) -> None:
    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path.rstrip("/").endswith("/torch") else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
        done, calls = _run(tmp_path, index)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert calls == [f"install --quiet --disable-pip-version-check --root-user-action=ignore --index-url {index} "
                     "torch==2.13.0"]
    assert f"{_expected_build()}, from PyTorch's CPU wheel index ({index})" in done.stdout


def test_this_machine_runs_the_cpu_build() -> None:
    """What set-up installed on a machine without a GPU (the CI machine): the CPU build, no CUDA libraries."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU machine: a CUDA build of torch is what it should run")
    assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA {torch.version.cuda} build"
