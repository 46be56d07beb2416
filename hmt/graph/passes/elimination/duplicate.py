"""duplicate: common-subexpression elimination.

Two nodes with the same op, domain, attributes and inputs compute the same value (random
ops excepted): the later one is removed and its readers read the first. Identical
constant initializers are merged first so that such nodes are recognised.
"""

from __future__ import annotations

from hmt.compat import strict_zip
from hmt.graph.passes.registry import register_pass
from hmt.graph.rewrite import GraphView

_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Dropout"}


def _merge_initializers(view: GraphView) -> int:
    import hashlib

    from onnx import numpy_helper

    seen: dict[tuple[int, tuple[int, ...], str], str] = {}
    merged = 0
    graph_inputs = {value.name for value in view.graph.input}
    for init in list(view.graph.initializer):
        if init.name in graph_inputs or init.name in view.graph_outputs:
            continue  # overridable or exported; leave it
        digest = hashlib.sha256(numpy_helper.to_array(init).tobytes()).hexdigest()
        key = (int(init.data_type), tuple(int(d) for d in init.dims), digest)
        first = seen.setdefault(key, init.name)
        if first != init.name:
            view.rename_uses(init.name, first)
            merged += 1
    if merged:
        view.prune()
    return merged


def _key(node: object) -> tuple[object, ...]:
    attrs = tuple(sorted((a.name, a.SerializeToString()) for a in node.attribute))  # type: ignore[attr-defined]
    return (node.op_type, node.domain, tuple(node.input), attrs, len(node.output))  # type: ignore[attr-defined]


@register_pass("duplicate", category="elimination", summary="merge identical initializers and identical nodes (CSE)")
def remove_duplicates(view: GraphView) -> int:
    fired = _merge_initializers(view)
    changed = True
    while changed:
        changed = False
        seen: dict[tuple[object, ...], object] = {}
        for node in list(view.graph.node):
            if node.op_type in _NONDETERMINISTIC or any(a.type in (5, 10) for a in node.attribute):
                continue
            key = _key(node)
            first = seen.setdefault(key, node)
            if first is node:
                continue
            if any(out in view.graph_outputs for out in node.output):
                continue
            for mine, theirs in strict_zip(node.output, first.output):  # type: ignore[attr-defined]
                if mine:
                    view.rename_uses(mine, theirs)
            view.remove(node)
            view.refresh()
            fired += 1
            changed = True
            break
    return fired
