"""Drop from a specialized supernet the operators none of its listed variants runs, keep a seeded
sample of N of its calibration images, and measure its variants again: what ``hmt specialize`` wrote carries every
alternative of its parent (w50, w25, ...) although only the listed variants are deployable. The
listed variants are checked to answer exactly as before (eval mode, random inputs, max abs 0)
before anything is written; their accuracy is measured again because BN statistics are
re-estimated on the (smaller) calibration set.

    python scripts/slim_supernet.py SRC DST --operators w75,skip --calibration-samples 1024 \
        --data ../shared/datasets/cifar10-jpeg

Then ``scripts/ship_supernet.py DST SHIPPED`` writes it without paths of this machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def slim_net(loaded: Any, operators: list[str]) -> Any:
    """The same network rebuilt with only ``operators``, with the source's weights (strict)."""
    from hmt.supernet.elastify.rebuild import rebuild

    info = copy.deepcopy(loaded.model_info)
    offered = {c for p in loaded.space.positions for c in p.choices} - {"base"}
    unknown = sorted(set(operators) - offered)
    if unknown:
        raise SystemExit(f"operators {unknown} are not in the source supernet's space ({sorted(offered)})")
    info["operators"] = list(operators)
    source = info["elastify"].get("source")
    net = rebuild(info, loaded.artifact.file(source) if source else None)
    state = {k: v for k, v in loaded.net.state_dict().items() if k in net.state_dict()}
    net.load_state_dict(state, strict=True)
    return info, net.eval()


def same_answers(loaded: Any, net: Any, arch_ids: list[str]) -> dict[str, str]:
    """old id -> new id for each listed variant, after checking it answers exactly as before."""
    x = torch.randn(8, *loaded.space.input_shape, generator=torch.Generator().manual_seed(0))
    mapping = {}
    loaded.net.eval()
    for old_id in arch_ids:
        old = loaded.space.parse(old_id)
        new = net.space.make([c if c != "-" else "base" for c in old.choices], old.exit_stage)
        with torch.no_grad():
            error = float((loaded.net(x, old) - net(x, new)).abs().max())
        if error != 0.0:
            raise SystemExit(f"{old_id}: answers differently after slimming (max abs {error:.3g})")
        mapping[old_id] = new.arch_id
    return mapping


def retag(text: str, old_tag: str, new_tag: str) -> str:
    return text.replace(old_tag + ".", new_tag + ".")


def write(dst: Path, loaded: Any, info: dict[str, Any], net: Any, calibration_x: np.ndarray, table_csv: str,
          samples: int, operators: list[str]) -> None:
    from safetensors.torch import save_file

    from hmt.artifacts import ArtifactWriter

    art = loaded.artifact
    old_tag, new_tag = loaded.space.tag, net.space.tag
    config = json.loads(retag(json.dumps(dict(art.manifest.config)), old_tag, new_tag))
    config["operators"], config["calibration_samples"] = list(operators), samples
    config.setdefault("extra", {})["slimmed"] = {
        "from_manifest_sha256": art.manifest_sha256, "operators": list(operators), "calibration_samples": samples,
        "check": "every listed variant answers as in the source (max abs 0, eval mode, random inputs)"}
    report = json.loads(art.file("elastify.json").read_text())
    report.update(net.report())
    with ArtifactWriter(dst, kind=art.kind, config=config, force=True) as writer:
        save_file({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()},
                  str(writer.path("weights.safetensors")))
        np.savez(writer.path("calibration.npz"), x=calibration_x)
        writer.write_json("supernet.json", info)
        writer.write_json("space.json", net.space.to_json_dict())
        writer.write_json("elastify.json", report)
        writer.write_bytes("variants.csv", table_csv.encode())
        for name in ("specialize.json", "history.json", "curves.png", info["elastify"].get("source")):
            if name and (art.root / name).is_file():
                data = art.file(name).read_bytes()
                writer.write_bytes(name, retag(data.decode(), old_tag, new_tag).encode()
                                   if name.endswith(".json") else data)
        writer.metrics.update(json.loads(retag(json.dumps(dict(art.manifest.metrics)), old_tag, new_tag)))


def measure(path: Path, data: Path, listed: list[str]) -> str:
    """variants.csv of the listed variants, measured as hmt specialize measures them."""
    from hmt.supernet import load_supernet
    from hmt.supernet.elastify.selection import Choice, SpecializeRequest
    from hmt.supernet.elastify.specialize import _Run, parent_config

    loaded = load_supernet(path)
    config = parent_config(loaded, SpecializeRequest(variants=("x",), data_path=str(data), device="cpu"))
    run = _Run(loaded, config, None, lambda *a, **k: None)
    largest = loaded.space.largest().arch_id
    choices = [Choice(loaded.space.parse(a), "--variants") for a in listed if a != largest]
    return str(run.table(choices).to_csv(index=False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--operators", required=True, help="comma-separated operators to keep (base is always)")
    parser.add_argument("--calibration-samples", type=int, required=True)
    parser.add_argument("--data", type=Path, required=True, help="the data the supernet was trained on")
    args = parser.parse_args()
    torch.set_num_threads(2)

    import pandas as pd

    from hmt.supernet import load_supernet

    loaded = load_supernet(args.src)
    operators = [o.strip() for o in args.operators.split(",") if o.strip()]
    listed = [str(a) for a in pd.read_csv(loaded.artifact.file("variants.csv")).arch_id]
    info, net = slim_net(loaded, operators)
    mapping = same_answers(loaded, net, listed)
    with np.load(loaded.artifact.file("calibration.npz")) as z:
        stored = z["x"]
    # A seeded sample, not the first N: the stored set may be in dataset order (class by class).
    keep = np.random.default_rng(0).choice(len(stored), size=min(args.calibration_samples, len(stored)),
                                           replace=False)
    calibration_x = stored[np.sort(keep)]
    old_table = retag(loaded.artifact.file("variants.csv").read_text(), loaded.space.tag, net.space.tag)
    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / "draft"
        write(draft, loaded, info, net, calibration_x, old_table, len(calibration_x), operators)
        table = measure(draft, args.data, [mapping[a] for a in listed])
    write(args.dst, loaded, info, net, calibration_x, table, len(calibration_x), operators)
    load_supernet(args.dst)
    print(f"wrote {args.dst}: operators {operators}, {len(calibration_x)} calibration images; "
          + "; ".join(f"{old} -> {new}" for old, new in mapping.items()))
    print(table)
    return 0


if __name__ == "__main__":
    from hmt.errors import HmtError

    try:
        raise SystemExit(main())
    except HmtError as exc:  # a bad input: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
