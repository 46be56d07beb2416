"""The ELF header of a shared library: which machine it was built for.

Only the first 20 bytes are needed (System V ABI): the magic, the class (32/64-bit), the
byte order, and ``e_machine`` at offset 18. Parsing them here keeps verify free of
extra dependencies and works for libraries built for any architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hmt.errors import ArtifactError

ELF_MAGIC = b"\x7fELF"
HEADER_BYTES = 20

# e_machine values (elf.h) of the architectures a bundle may carry, and a few that
# signal a wrong build.
MACHINES = {
    3: "i386",
    8: "mips",
    20: "ppc",
    21: "ppc64",
    40: "arm",
    62: "x86_64",
    183: "aarch64",
    190: "cuda",
    243: "riscv",
}


@dataclass(frozen=True)
class ElfHeader:
    bits: int
    little_endian: bool
    machine_code: int

    @property
    def machine(self) -> str:
        return MACHINES.get(self.machine_code, f"unknown({self.machine_code})")


def parse_elf_header(data: bytes, *, where: str = "file") -> ElfHeader:
    """Parse the first bytes of an ELF file; refuses anything that is not ELF."""
    if len(data) < HEADER_BYTES or not data.startswith(ELF_MAGIC):
        raise ArtifactError(f"{where}: not an ELF file (expected a shared library starting with \\x7fELF)")
    ei_class, ei_data = data[4], data[5]
    if ei_class not in (1, 2) or ei_data not in (1, 2):
        raise ArtifactError(f"{where}: malformed ELF header (class {ei_class}, data {ei_data})")
    little = ei_data == 1
    machine = int.from_bytes(data[18:20], "little" if little else "big")
    return ElfHeader(bits=32 if ei_class == 1 else 64, little_endian=little, machine_code=machine)


def read_elf_header(path: Path) -> ElfHeader:
    with open(path, "rb") as handle:
        return parse_elf_header(handle.read(HEADER_BYTES), where=str(path))
