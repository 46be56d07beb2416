"""deploy: a target registry, checksummed bundles for a target, verification and push over ssh.

``targets`` (the registry), ``sources`` (reading fused/pareto/profile inputs, lineage),
``compile`` (TVM cross-compilation of one graph), ``build`` (the bundle), ``archive``
(deterministic tar.gz, tar-slip-safe extraction), ``elf`` (ELF header), ``verify`` and
``push``. Importing this package imports neither torch nor tvm.
"""

from hmt.deploy.archive import extract_archive, write_archive
from hmt.deploy.build import DeployOptions, DeployResult, VariantBuild, deploy_bundle
from hmt.deploy.elf import ElfHeader, parse_elf_header, read_elf_header
from hmt.deploy.push import PushResult, parse_destination, push_bundle
from hmt.deploy.targets import TARGETS, GpuSpec, Target, get_target, list_targets
from hmt.deploy.verify import VerifyReport, verify_bundle

__all__ = [
    "TARGETS",
    "DeployOptions",
    "DeployResult",
    "ElfHeader",
    "GpuSpec",
    "PushResult",
    "Target",
    "VariantBuild",
    "VerifyReport",
    "deploy_bundle",
    "extract_archive",
    "get_target",
    "list_targets",
    "parse_destination",
    "parse_elf_header",
    "push_bundle",
    "read_elf_header",
    "verify_bundle",
    "write_archive",
]
