"""Build hmt/data/embedded/{train,test}.zip: a stratified CIFAR-10 subset for tests and demos.

Picks ``--train-per-class`` / ``--test-per-class`` images per class from the shared
JPEG zips with a fixed seed and copies their bytes unchanged (no re-encode) into stored
zips with the same ``<split>/<class>/NNNN.jpg`` layout. Entries keep their source names
and timestamps and are written in sorted order, so a rerun gives byte-identical files.

    python scripts/make_embedded_subset.py --source ../shared/datasets/cifar10-jpeg
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hmt.artifacts.store import atomic_write_bytes  # noqa: E402
from hmt.data.cifar import CIFAR10_CLASSES  # noqa: E402

SEED = 2009


def pick(source_zip: Path, split: str, per_class: int, rng: np.random.Generator) -> list[zipfile.ZipInfo]:
    with zipfile.ZipFile(source_zip) as archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
    chosen: list[zipfile.ZipInfo] = []
    for name in CIFAR10_CLASSES:
        in_class = sorted((m for m in members if m.filename.startswith(f"{split}/{name}/")), key=lambda m: m.filename)
        if len(in_class) < per_class:
            raise SystemExit(f"{source_zip}: class {name} has {len(in_class)} images, fewer than {per_class}")
        picked = rng.choice(len(in_class), size=per_class, replace=False)
        chosen.extend(in_class[i] for i in sorted(picked))
    return chosen


def write_subset(source_zip: Path, members: list[zipfile.ZipInfo], out: Path) -> None:
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(source_zip) as source, zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as target:
        for member in members:
            info = zipfile.ZipInfo(member.filename, date_time=member.date_time)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            target.writestr(info, source.read(member))
    atomic_write_bytes(out, buffer.getvalue())
    out.chmod(0o644)  # mkstemp creates 0600; the files are committed and read by everyone


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=REPO.parent / "shared" / "datasets" / "cifar10-jpeg")
    parser.add_argument("--out", type=Path, default=REPO / "hmt" / "data" / "embedded")
    parser.add_argument("--train-per-class", type=int, default=200)
    parser.add_argument("--test-per-class", type=int, default=100)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    for split, per_class in (("train", args.train_per_class), ("test", args.test_per_class)):
        source_zip = args.source / f"{split}.zip"
        out = args.out / f"{split}.zip"
        members = pick(source_zip, split, per_class, rng)
        write_subset(source_zip, members, out)
        print(f"{out}: {len(members)} images, {out.stat().st_size} bytes, sha256 {sha256(out)}")
        print(f"  from {source_zip} sha256 {sha256(source_zip)}")


if __name__ == "__main__":
    main()
