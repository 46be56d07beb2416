"""Pack the CIFAR-10 JPEG zips into one compact blob for the GPU machine, and back.

The device tool carries at most 64 MiB; the stored zips carry ~6 MB of per-entry headers.
``pack`` writes every entry's name and unchanged JPEG bytes into one file; ``unpack``
rebuilds stored zips with the same entry names and bytes (the images are identical, only
zip metadata such as timestamps differs).

    python scripts/gpu_pack_cifar.py pack ../shared/datasets/cifar10-jpeg .gpu/cifar10.blob
    python scripts/gpu_pack_cifar.py unpack .gpu/cifar10.blob /tmp/cifar10-jpeg
"""

from __future__ import annotations

import struct
import sys
import zipfile
from pathlib import Path


def pack(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "wb") as out:
        for split in ("train", "test"):
            with zipfile.ZipFile(src / f"{split}.zip") as archive:
                for info in archive.infolist():
                    if info.is_dir():
                        continue
                    name = f"{split}.zip::{info.filename}".encode()
                    data = archive.read(info)
                    out.write(struct.pack("<HI", len(name), len(data)))
                    out.write(name)
                    out.write(data)


def unpack(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    archives: dict[str, zipfile.ZipFile] = {}
    with open(src, "rb") as blob:
        while header := blob.read(6):
            name_len, data_len = struct.unpack("<HI", header)
            zip_name, entry = blob.read(name_len).decode().split("::", 1)
            data = blob.read(data_len)
            if zip_name not in archives:
                archives[zip_name] = zipfile.ZipFile(dst / zip_name, "w", compression=zipfile.ZIP_STORED)
            # A fixed timestamp makes every unpack byte-identical, so the data's sha256 (which
            # a supernet artifact records) is the same on every machine that unpacks the blob.
            info = zipfile.ZipInfo(entry, date_time=(2020, 1, 1, 0, 0, 0))
            archives[zip_name].writestr(info, data, compress_type=zipfile.ZIP_STORED)
    for archive in archives.values():
        archive.close()


if __name__ == "__main__":
    command, a, b = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    {"pack": pack, "unpack": unpack}[command](a, b)
