"""hmt.serve must import (and decide) on a device without torch, typer or rich."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CODE = textwrap.dedent(
    """
    import sys

    BLOCKED = ("torch", "typer", "rich")

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked import of {name}")
            return None

    sys.meta_path.insert(0, Block())
    import hmt.serve
    from hmt.serve import Optimizer, Variant

    opt = Optimizer([Variant("a", 0.9, 10.0, 5.0, 100)])
    assert opt.decide(0.2, 50.0).arch_id == "a"
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("ok")
    """
)


def test_import_without_torch() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
