"""The on-device half of offloading (device, peer, proxy) imports without torch, onnx, typer or rich."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CODE = textwrap.dedent(
    """
    import sys

    BLOCKED = ("torch", "onnx", "typer", "rich")

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked import of {name}")
            return None

    sys.meta_path.insert(0, Block())
    import hmt.offload.device, hmt.offload.peer, hmt.offload.proxy, hmt.offload.server, hmt.offload.session
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("ok")
    """
)


def test_offload_runtime_imports_without_torch_or_onnx() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
