"""Graph analysis: cut the traced model into single-input single-output blocks, find the
stem, the classifier head and the stages (AdaptiveNet section 4.1).

A *cut point* is a node after which the only tensor still needed is that node's output.
Consecutive cut points bound an atomic segment: a residual block, an inverted residual or
a concatenation of branches is one segment because its skip or branch edges cross every
node inside it. Segments with one weighted op (conv or linear) start a conv-BN-activation
chain that takes the weightless segments after it (BN, activation, pooling); segments with
several weighted ops are blocks of their own. The head starts at the global pooling that
precedes the first rank-2 tensor; stages are runs of blocks with the same output size.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field

import torch
from torch import fx, nn

from hmt.errors import ModelError
from hmt.supernet.elastify.trace import output_shape

_POOL_MODULES = (
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.Flatten,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Identity,
)
_POOL_FUNCTIONS = {
    torch.flatten,
    torch.mean,
    torch.amax,
    torch.nn.functional.adaptive_avg_pool1d,
    torch.nn.functional.adaptive_avg_pool2d,
    torch.nn.functional.dropout,
    torch.nn.functional.avg_pool2d,
    torch.nn.functional.avg_pool1d,
}
_POOL_METHODS = {"mean", "flatten", "view", "reshape", "squeeze", "size", "amax"}
WEIGHTED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


@dataclass
class Segment:
    """Nodes between two cut points: ``input`` (the previous cut) -> ``nodes`` -> ``output``."""

    input: fx.Node
    nodes: list[fx.Node]

    @property
    def output(self) -> fx.Node:
        return self.nodes[-1]


@dataclass
class BlockPlan:
    """One block of the original model, as the nodes that compute it."""

    input: fx.Node
    nodes: list[fx.Node]
    kind: str = "plain"
    leaves: list[str] = field(default_factory=list)
    owner: str | None = None  # the user's module this block is (None: a conv-BN-act chain)

    @property
    def output(self) -> fx.Node:
        return self.nodes[-1]

    @property
    def in_shape(self) -> tuple[int, ...]:
        return _shape(self.input)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return _shape(self.output)

    def module_paths(self) -> list[str]:
        return [str(n.target) for n in self.nodes if n.op == "call_module"]


def channels_last(gm: fx.GraphModule, block: BlockPlan) -> bool:
    """Whether ``block`` hands its features on channels-last ((N, H, W, C) or (N, L, C)), as the stages
    of Swin-style transformers do: the last layer with weights that computes it is a Linear or
    LayerNorm over the last axis whose output has the block's own shape, and that axis is not axis 1
    (ConvNeXt's blocks also run a Linear channels-last, but permute back: their output is (N, C, H, W))."""
    shape = block.out_shape
    for node in reversed(block.nodes):
        if node.op != "call_module":
            continue
        module = gm.get_submodule(str(node.target))
        if not any(True for _ in module.parameters()):
            continue
        if isinstance(module, nn.Linear):
            width = module.out_features
        elif isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1:
            width = module.normalized_shape[0]
        else:
            return False
        return len(shape) >= 3 and _shape(node) == shape and width == shape[-1] != shape[1]
    return False


@dataclass
class ModelPlan:
    stem: BlockPlan | None
    blocks: list[BlockPlan]
    head: BlockPlan
    stages: list[int]  # stage of each block
    dims: int  # spatial dimensions: 2 for images, 1 for sequences

    @property
    def num_stages(self) -> int:
        return max(self.stages) + 1


def _shape(node: fx.Node) -> tuple[int, ...]:
    shape = output_shape(node)
    if shape is None:
        raise ModelError(f"cannot elastify: no tensor shape recorded for node {node.name}")
    return shape


def cut_points(gm: fx.GraphModule) -> list[fx.Node]:
    """Nodes whose output is the only tensor alive after them (get_attr constants aside)."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("get_attr", "output")]
    index = {n: i for i, n in enumerate(nodes)}
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    last_use: dict[fx.Node, int] = {}
    for n in nodes:
        uses = [index[u] for u in n.users if u in index]
        last_use[n] = max(uses) if uses else (len(nodes) if out_node in n.users else index[n])
    cuts: list[fx.Node] = []
    open_nodes: set[fx.Node] = set()
    for i, n in enumerate(nodes):
        open_nodes.add(n)
        open_nodes = {m for m in open_nodes if last_use[m] > i}
        if open_nodes == {n} and output_shape(n) is not None:
            cuts.append(n)
    return cuts


def segments(gm: fx.GraphModule) -> list[Segment]:
    cuts = cut_points(gm)
    nodes = [n for n in gm.graph.nodes if n.op not in ("get_attr", "output", "placeholder")]
    position = {n: i for i, n in enumerate(nodes)}
    out: list[Segment] = []
    for a, b in itertools.pairwise(cuts):
        start = position[a] + 1 if a in position else 0
        out.append(Segment(a, nodes[start : position[b] + 1]))
    return out


def _module(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    return gm.get_submodule(str(node.target)) if node.op == "call_module" else None


def _weighted_count(gm: fx.GraphModule, nodes: list[fx.Node], leaves: set[str]) -> tuple[int, list[str]]:
    count, found = 0, []
    for n in nodes:
        if n.op == "call_module":
            if str(n.target) in leaves:
                found.append(str(n.target))
                count += 2  # an opaque leaf is a block of its own
            elif isinstance(_module(gm, n), WEIGHTED):
                count += 1
        elif n.op == "call_function" and n.target in (torch.nn.functional.conv2d, torch.nn.functional.linear):
            count += 1
    return count, found


def _is_pool_like(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(_module(gm, node), _POOL_MODULES)
    if node.op == "call_function":
        # getitem and getattr: x.shape[0] of a view(x.shape[0], -1) before the classifier
        return node.target in _POOL_FUNCTIONS or node.target is operator.getitem or node.target is getattr
    if node.op == "call_method":
        return str(node.target) in _POOL_METHODS
    return False


def _classify(gm: fx.GraphModule, plan: BlockPlan) -> str:
    if plan.leaves:
        return "opaque"
    convs = [m for n in plan.nodes if isinstance(m := _module(gm, n), nn.Conv1d | nn.Conv2d)]
    depthwise = any(c.groups > 1 and c.groups == c.in_channels for c in convs)
    targets = {getattr(n.target, "__name__", str(n.target)) for n in plan.nodes if n.op != "call_module"}
    kind = "plain"
    if targets & {"cat", "concat", "chunk", "split"}:
        kind = "concat"
    elif targets & {"add", "iadd"}:
        kind = "inverted" if depthwise else "residual"
    elif depthwise:
        kind = "depthwise"
    gates = any(isinstance(_module(gm, n), nn.Sigmoid | nn.Hardsigmoid) for n in plan.nodes)
    if "mul" in targets and (gates or targets & {"sigmoid", "hardsigmoid"}):
        kind += "-se"
    return kind


def _merge_shared(gm: fx.GraphModule, segs: list[Segment]) -> list[Segment]:
    """Segments that call the same parameterised module are merged (and all between), so
    no parameter belongs to two blocks."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, seg in enumerate(segs):
        for n in seg.nodes:
            if n.op in ("call_module", "get_attr"):
                target = str(n.target)
                owner = gm.get_submodule(target) if n.op == "call_module" else None
                if owner is not None and not any(True for _ in owner.parameters()):
                    continue
                first.setdefault(target, i)
                last[target] = i
            for a in n.all_input_nodes:
                if a.op == "get_attr":
                    first.setdefault(str(a.target), i)
                    last[str(a.target)] = i
    merged: list[Segment] = []
    i = 0
    while i < len(segs):
        end = i
        j = i
        while j <= end:
            for n in segs[j].nodes:
                for t in [str(n.target)] + [str(a.target) for a in n.all_input_nodes if a.op == "get_attr"]:
                    if t in last:
                        end = max(end, last[t])
            j += 1
        merged.append(Segment(segs[i].input, [n for s in segs[i : end + 1] for n in s.nodes]))
        i = end + 1
    return merged


def _owners(gm: fx.GraphModule, seg: Segment, max_params: float) -> list[str]:
    """Modules of the user's own (not torch.nn layers or containers), outermost first, that
    hold every node of ``seg`` and at most ``max_params`` parameters."""
    chains = []
    for node in seg.nodes:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            return []
        chains.append([(path, cls) for path, cls in stack.values()])
    owners: list[str] = []
    for depth, (path, cls) in enumerate(chains[0]):
        if any(len(c) <= depth or c[depth][0] != path for c in chains):
            break
        if getattr(cls, "__module__", "").startswith("torch.nn."):
            continue
        try:
            size = sum(p.numel() for p in gm.get_submodule(path).parameters())
        except AttributeError:
            continue
        if size <= max_params:
            owners.append(str(path))
    return owners


def _complete(gm: fx.GraphModule, nodes: list[fx.Node], leaves: set[str]) -> bool:
    """A residual add, a concatenation or an opaque leaf: a block by itself."""
    for n in nodes:
        name = getattr(n.target, "__name__", str(n.target))
        if n.op in ("call_function", "call_method") and name in ("add", "iadd", "cat", "concat", "chunk", "split"):
            return True
        if n.op == "call_module" and str(n.target) in leaves:
            return True
    return False


# AdaptiveNet 4.1 bounds a block's parameters by gamma * P0; a user module larger than this
# share is split into its parts instead of becoming one block.
BLOCK_PARAM_SHARE = 0.5
# What elastification takes, said where a model is refused for its kind.
SUPPORTED_MODELS = ("hmt elastifies convolutional classifiers: Conv1d/Conv2d feature layers on a (batch, C, L) or "
                    "(batch, C, H, W) input, then a head that pools or flattens them into (batch, classes) logits")


def plan_model(gm: fx.GraphModule, leaves: set[str]) -> ModelPlan:
    """Blocks, stem, head and stages of a traced model with shapes propagated."""
    segs = _merge_shared(gm, segments(gm))
    if not segs:
        raise ModelError("cannot elastify: the traced model has no operations")
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    if not isinstance(out_node.args[0], fx.Node):
        raise ModelError("cannot elastify: forward() must return one tensor of logits (batch, classes)")
    first_flat = next((i for i, s in enumerate(segs) if len(_shape(s.output)) == 2), None)
    if first_flat is None:
        raise ModelError(
            "cannot elastify: no classifier head found (no rank-2 (batch, classes) tensor after the features); "
            f"{SUPPORTED_MODELS}"
        )
    head_start = first_flat
    while head_start > 0 and all(_is_pool_like(gm, n) for n in segs[head_start].nodes):
        head_start -= 1
    if not all(_is_pool_like(gm, n) for n in segs[head_start].nodes):
        head_start += 1
    head_start = min(head_start, first_flat)
    body, head_segs = segs[:head_start], segs[head_start:]
    if not body:
        raise ModelError("cannot elastify: the model has no feature layers before its classifier head (it flattens "
                         f"its input at once, as an MLP does); {SUPPORTED_MODELS}")
    total_params = sum(p.numel() for p in gm.parameters())
    blocks: list[BlockPlan] = []
    owners_of: list[list[str]] = []  # per block: the user modules every part of it lies in
    for seg in body:
        count, found = _weighted_count(gm, seg.nodes, leaves)
        owners = _owners(gm, seg, BLOCK_PARAM_SHARE * total_params)
        previous = blocks[-1] if blocks else None
        if previous is not None:
            shared = [o for o in owners_of[-1] if o in owners]
            if shared and not _complete(gm, previous.nodes, leaves) and not _complete(gm, seg.nodes, leaves):
                # parts of one module of the user's (e.g. a non-residual inverted residual)
                previous.nodes.extend(seg.nodes)
                owners_of[-1] = shared
                previous.owner = shared[0]
                continue
            if count == 0 and not found:  # BN, activation, pooling: end of the block before
                previous.nodes.extend(seg.nodes)
                continue
            weightless = previous.owner is None and _weighted_count(gm, previous.nodes, leaves)[0] == 0
            if not owners and count <= 1 and not found and weightless:
                previous.nodes.extend(seg.nodes)  # a weightless prefix (e.g. an input norm) joins the first conv
                continue
        blocks.append(BlockPlan(seg.input, list(seg.nodes), leaves=found, owner=owners[0] if owners else None))
        owners_of.append(owners)
    for plan in blocks:
        plan.kind = _classify(gm, plan)
        # The features' rank, not the input's: a sequence may run as a one-channel image (x.unsqueeze(1)).
        if len(plan.out_shape) not in (3, 4):
            raise ModelError(f"cannot elastify: features of rank {len(plan.out_shape)} after "
                             f"{plan.owner or plan.nodes[-1].name}; {SUPPORTED_MODELS}")
    stem = None
    if blocks and blocks[0].kind in ("plain", "depthwise") and len(blocks) > 1:
        stem = blocks.pop(0)
    if not blocks:
        raise ModelError("cannot elastify: found no blocks between the stem and the head")
    stages: list[int] = []
    stage, previous_size = 0, None
    for plan in blocks:
        size = plan.out_shape[2:]
        if previous_size is not None and size != previous_size:
            stage += 1
        stages.append(stage)
        previous_size = size
    head = BlockPlan(head_segs[0].input, [n for s in head_segs for n in s.nodes], kind="head")
    return ModelPlan(stem=stem, blocks=blocks, head=head, stages=stages, dims=len(blocks[-1].out_shape) - 2)


def submodule_of(gm: fx.GraphModule, plan: BlockPlan, name: str) -> fx.GraphModule:
    """The plan's nodes as a GraphModule of one input; shares the modules of ``gm``."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {plan.input: graph.placeholder("x")}
    env[plan.input].meta.update(plan.input.meta)  # the input's recorded shape, as every node inside keeps its own

    def arg(node: fx.Node) -> fx.Node:
        if node not in env:
            if node.op != "get_attr":
                raise ModelError(f"cannot elastify: block {name} reads {node.name} from outside the block")
            env[node] = graph.node_copy(node)
        return env[node]

    for node in plan.nodes:
        for a in node.all_input_nodes:
            arg(a)
        env[node] = graph.node_copy(node, arg)
    graph.output(env[plan.output])
    return fx.GraphModule(gm, graph, name)
