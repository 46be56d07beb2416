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


SERVE_CODE = textwrap.dedent(
    """
    import sys

    # An entry of None makes any import of these fail (as on a device without them).
    for name in ("torch", "onnx", "pandas", "matplotlib", "typer", "rich", "scipy"):
        sys.modules[name] = None

    import http.client, io, json
    import numpy as np
    from hmt.serve.http.api import ApiOptions, create_app
    from hmt.serve.http.server import ApiServer, ServerOptions
    from hmt.serve.running.session import SessionOptions, open_controller

    controller = open_controller(sys.argv[1], SessionOptions(engine="auto"))
    controller.start()
    server = ApiServer(create_app(controller, ApiOptions()), ServerOptions(port=0))
    server.start_background()
    buf = io.BytesIO()
    np.save(buf, np.array([[0, 0, 7, 0]], dtype=np.float32))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/predict", body=buf.getvalue(), headers={"content-type": "application/x-npy"})
    response = conn.getresponse()
    doc = json.loads(response.read())
    server.stop_background()
    controller.stop()
    assert response.status == 200 and doc["class"] == 2, doc
    heavy = sorted(m for m in ("torch", "onnx", "pandas", "matplotlib") if sys.modules.get(m) is not None)
    assert not heavy, heavy
    print("served")
    """
)


def test_serve_path_predicts_with_torch_unimportable(bundle_dir) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run([sys.executable, "-c", SERVE_CODE, str(bundle_dir)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "served"
