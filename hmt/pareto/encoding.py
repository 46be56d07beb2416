"""Decision variables of the search and their integer encoding.

A candidate is one gene per block position (the operator choice), one for the exit
stage, and one for the engine option. The offload cut is not a gene: with a link to a
peer, :class:`hmt.pareto.offload.OffloadCostModel` prices every variant at its best cut
and sets ``Candidate.offload_cut`` (``None``: all local, the default without a peer).

Each position's choices are ordered by predicted cost (cheapest first), so genes are
ordinal: a step of +-1 moves to the neighbouring cost level (w75 -> w50 -> w25 on the
channel axis). That is what makes Gaussian noise injection, SBX crossover and
polynomial mutation meaningful on these integers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hmt.errors import UsageError
from hmt.supernet.space import NOT_EXECUTED, ArchConfig, SearchSpace

DEFAULT_ENGINE = "default"


@dataclass(frozen=True)
class Variable:
    """One decision variable: its name and its options in gene order."""

    name: str
    options: tuple[str, ...]

    @property
    def cardinality(self) -> int:
        return len(self.options)


@dataclass(frozen=True)
class Candidate:
    """A decoded, canonical point of the search space."""

    arch: ArchConfig
    engine: str = DEFAULT_ENGINE
    offload_cut: int | None = None  # set by OffloadCostModel.candidate; None: all on the device
    # Numeric precision (hmt.precision): fp32, or a quantised copy of the same arch whose
    # accuracy was measured (hmt.pareto.precision); its id is the arch id + ".int8"/".fp16".
    precision: str = "fp32"

    @property
    def variant_id(self) -> str:
        """The arch id, with the precision as a suffix when it is not fp32."""
        return self.arch.arch_id if self.precision == "fp32" else f"{self.arch.arch_id}.{self.precision}"

    @property
    def key(self) -> str:
        """Unique key: the variant id (arch id + precision) and the engine."""
        return f"{self.variant_id}@{self.engine}"

    def to_json_dict(self) -> dict[str, object]:
        data = self.arch.to_json_dict() | {"engine": self.engine, "offload_cut": self.offload_cut,
                                           "precision": self.precision}
        if self.precision != "fp32":
            data |= {"arch_id": self.variant_id, "base_arch_id": self.arch.arch_id}
        return data


class Encoding:
    """Integer genes <-> candidates for one search space.

    ``choice_order`` maps a position name to its choices in gene order (default: the
    space's order); it must be a permutation of that position's choices.
    """

    def __init__(self, space: SearchSpace, *, choice_order: Mapping[str, Sequence[str]] | None = None,
                 engines: Sequence[str] = (DEFAULT_ENGINE,)) -> None:
        if not engines:
            raise UsageError("at least one engine option is needed")
        self.space = space
        variables = []
        for pos in space.positions:
            order = tuple(choice_order[pos.name]) if choice_order and pos.name in choice_order else pos.choices
            if sorted(order) != sorted(pos.choices):
                raise UsageError(f"choice order for {pos.name} {list(order)} is not a permutation of "
                                 f"{list(pos.choices)}")
            variables.append(Variable(pos.name, order))
        variables.append(Variable("exit", tuple(str(s) for s in range(space.num_stages))))
        variables.append(Variable("engine", tuple(engines)))
        self.variables: tuple[Variable, ...] = tuple(variables)
        self.n_positions = len(space.positions)
        self.exit_gene = self.n_positions
        self.engine_gene = self.n_positions + 1
        self.upper = np.array([v.cardinality - 1 for v in self.variables], dtype=np.int64)
        self._gene_of = [{c: i for i, c in enumerate(v.options)} for v in self.variables]

    @property
    def engines(self) -> tuple[str, ...]:
        return self.variables[self.engine_gene].options

    def candidate(self, arch: ArchConfig, engine: str | None = None) -> Candidate:
        """A candidate of this encoding (the first engine option unless one is named)."""
        return Candidate(arch, self.engines[0] if engine is None else engine)

    @property
    def n_var(self) -> int:
        return len(self.variables)

    def clip(self, x: Sequence[int] | Sequence[float] | np.ndarray) -> np.ndarray:
        """Round and clip genes into range (rows or a single vector)."""
        return np.clip(np.rint(np.asarray(x, dtype=float)), 0, self.upper).astype(np.int64)

    def decode(self, x: Sequence[int] | np.ndarray) -> Candidate:
        if np.shape(x) != (self.n_var,):
            raise UsageError(f"expected {self.n_var} genes, got shape {np.shape(x)}")
        genes = self.clip(x)
        choices = [self.variables[i].options[int(genes[i])] for i in range(self.n_positions)]
        exit_stage = int(self.variables[self.exit_gene].options[int(genes[self.exit_gene])])
        engine = self.variables[self.engine_gene].options[int(genes[self.engine_gene])]
        return Candidate(self.space.make(choices, exit_stage), engine)

    def encode(self, candidate: Candidate) -> np.ndarray:
        """Genes of a candidate; positions it does not execute get gene 0."""
        arch = candidate.arch
        if arch.space_tag != self.space.tag:
            raise UsageError(f"arch {arch.arch_id} is for space {arch.space_tag}, not {self.space.tag}")
        genes = np.zeros(self.n_var, dtype=np.int64)
        for i, choice in enumerate(arch.choices):
            genes[i] = 0 if choice == NOT_EXECUTED else self._gene_of[i][choice]
        genes[self.exit_gene] = self._gene_of[self.exit_gene][str(arch.exit_stage)]
        if candidate.engine not in self._gene_of[self.engine_gene]:
            raise UsageError(f"engine {candidate.engine!r} is not one of {list(self.variables[-1].options)}")
        genes[self.engine_gene] = self._gene_of[self.engine_gene][candidate.engine]
        return genes

    def random(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` uniformly random gene vectors."""
        return rng.integers(0, self.upper + 1, size=(n, self.n_var))
