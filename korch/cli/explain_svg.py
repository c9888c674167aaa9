"""The primitive graph of a plan as inline SVG: layered layout, nodes coloured by kernel."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

NODE_W, NODE_H = 96, 18  # px
COL_PITCH, ROW_PITCH = 104, 34
MARGIN = 12
BAND, BAND_GAP = 40, 36  # layers per band; px between bands


@dataclass(frozen=True)
class DrawNode:
    label: str
    title: str
    kernels: tuple[int, ...] = ()  # plan kernels that compute it (several when recomputed)
    deps: tuple[int, ...] = ()  # indices of earlier DrawNodes it reads
    output: bool = False  # writes a graph output


def kernel_colour(k: int) -> str:
    """Well-separated light fills (golden-angle hues, three lightness steps) for black text."""
    return f"hsl({(k * 137.508) % 360:.1f},{62 + 12 * (k % 2)}%,{78 - 8 * (k % 3)}%)"


def _owners(plan) -> dict[int, tuple[int, ...]]:
    owners: dict[int, list[int]] = {}
    for ki, k in enumerate(plan.kernels):
        for n in k.nodes:
            owners.setdefault(n, []).append(ki)
    return {n: tuple(ks) for n, ks in owners.items()}


def _graph_nodes(plan) -> list[DrawNode]:
    graph, owners = plan.graph, _owners(plan)
    out = [DrawNode(f"in {v}", f"input {v}: {graph.types[v]}") for v in graph.inputs]
    where = {v: i for i, v in enumerate(graph.inputs)}
    outputs = set(graph.outputs)
    for idx, node in enumerate(graph.nodes):
        kernels = owners.get(idx, ())
        shapes = ", ".join(str(graph.types[v]) for v in node.outputs)
        title = f"#{idx} {node.prim.value} ({node.origin or '-'}) -> {shapes}; kernel {_ks(kernels)}"
        deps = tuple(dict.fromkeys(where[v] for v in node.inputs if v in where))
        for v in node.outputs:
            where[v] = len(out)
        out.append(DrawNode(node.prim.value, title, kernels, deps, bool(outputs.intersection(node.outputs))))
    return out


def _kernel_nodes(plan) -> list[DrawNode]:
    """Without the whole graph (older plans): each kernel's own primitives, wired through the
    values kernels hand each other."""
    out: list[DrawNode] = []
    where: dict[str, int] = {}
    outputs = {v for v, _ in plan.outputs}
    for ki, k in enumerate(plan.kernels):
        g = k.spec.graph
        rename = dict(zip(g.inputs, k.spec.inputs))
        rename.update(zip(g.outputs, k.spec.outputs))
        for node in g.nodes:
            shapes = ", ".join(str(g.types[v]) for v in node.outputs)
            title = f"{node.prim.value} ({node.origin or '-'}) -> {shapes}; kernel {ki}"
            deps = tuple(
                dict.fromkeys(
                    where[rename.get(v, f"{ki}:{v}")]
                    for v in node.inputs
                    if rename.get(v, f"{ki}:{v}") in where
                )
            )
            names = [rename.get(v, f"{ki}:{v}") for v in node.outputs]
            for v in names:
                where[v] = len(out)
            out.append(DrawNode(node.prim.value, title, (ki,), deps, bool(outputs.intersection(names))))
    return out


def _ks(kernels: tuple[int, ...]) -> str:
    return ", ".join(map(str, kernels)) or "none"


def plan_nodes(plan) -> list[DrawNode]:
    """The nodes to draw, in topological order."""
    return _graph_nodes(plan) if plan.graph is not None else _kernel_nodes(plan)


def layout(nodes: list[DrawNode]) -> list[tuple[int, int]]:
    """(layer, column) per node. Layers: longest path from a source (nodes are in topological
    order). Columns: each layer sorted by the barycentre of its predecessors' columns, nodes of
    one kernel kept together, each placed at its barycentre when free (so chains run straight)."""
    layer = _layers(nodes)
    by_layer: dict[int, list[int]] = {}
    for i, l in enumerate(layer):
        by_layer.setdefault(l, []).append(i)
    column = [0] * len(nodes)
    for l in sorted(by_layer):
        members = by_layer[l]
        bary = {i: _mean([column[d] for d in nodes[i].deps], float(pos)) for pos, i in enumerate(members)}
        group: dict[int, list[float]] = {}
        for i in members:
            group.setdefault(_first(nodes[i].kernels), []).append(bary[i])
        key = {k: _mean(v, 0.0) for k, v in group.items()}
        members.sort(key=lambda i: (key[_first(nodes[i].kernels)], _first(nodes[i].kernels), bary[i], i))
        last = -1
        for i in members:
            column[i] = last = max(round(bary[i]), last + 1)
    return [(layer[i], column[i]) for i in range(len(nodes))]


def _layers(nodes: list[DrawNode]) -> list[int]:
    """Longest path from a source; sources (inputs, broadcast constants) then move down to just
    above their first reader, so they do not pull long edges from the top of the drawing."""
    layer = [0] * len(nodes)
    for i, n in enumerate(nodes):
        layer[i] = 1 + max((layer[d] for d in n.deps), default=-1)
    first_reader: dict[int, int] = {}
    for i, n in enumerate(nodes):
        for d in n.deps:
            first_reader[d] = min(first_reader.get(d, layer[i]), layer[i])
    for i, n in enumerate(nodes):
        if not n.deps and i in first_reader:
            layer[i] = first_reader[i] - 1
    return layer


def _first(kernels: tuple[int, ...]) -> int:
    return kernels[0] if kernels else -1


def _mean(values: list, default: float) -> float:
    return sum(values) / len(values) if values else default


def _edge(x1: float, y1: float, x2: float, y2: float) -> str:
    bend = min(ROW_PITCH * 0.8, (y2 - y1) / 2)
    return f"M{x1:.0f} {y1:.0f}C{x1:.0f} {y1 + bend:.0f} {x2:.0f} {y2 - bend:.0f} {x2:.0f} {y2:.0f}"


def _wrap(positions: list[tuple[int, int]], band: int) -> list[tuple[int, int]]:
    """Pixel positions: layers top to bottom, wrapped every `band` layers into side-by-side
    bands like newspaper columns, so a deep narrow graph fills the width instead of one tall strip."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for layer, col in positions:
        b = layer // band
        lo[b], hi[b] = min(lo.get(b, col), col), max(hi.get(b, col), col)
    offset, x = {}, MARGIN
    for b in sorted(lo):
        offset[b] = x - lo[b] * COL_PITCH
        x += (hi[b] - lo[b] + 1) * COL_PITCH + BAND_GAP
    return [(offset[l // band] + c * COL_PITCH, MARGIN + (l % band) * ROW_PITCH) for l, c in positions]


def svg(nodes: list[DrawNode], positions: list[tuple[int, int]], band: int = BAND) -> str:
    """Top-to-bottom drawing: rows are layers, wrapped into bands. Edges inside one kernel take
    its colour; edges between kernels (values written to memory) are grey; edges into the next
    band are dashed."""
    xy = _wrap(positions, band)
    width = max((x for x, _ in xy), default=0) + NODE_W + MARGIN
    height = max((y for _, y in xy), default=0) + NODE_H + MARGIN
    edges, boxes = [], []
    for i, n in enumerate(nodes):
        x2, y2 = xy[i]
        for d in n.deps:
            x1, y1 = xy[d]
            shared = set(n.kernels).intersection(nodes[d].kernels)
            colour = _stroke(min(shared)) if shared else "#9a9a9a"
            cls = ("e in" if shared else "e") + (" wrap" if y1 >= y2 else "")
            path = _edge(x1 + NODE_W / 2, y1 + NODE_H, x2 + NODE_W / 2, y2)
            edges.append(f'<path class="{cls}" d="{path}" stroke="{colour}"/>')
        boxes.append(_box(i, n, x2, y2))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="graph" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" data-w="{width}" data-h="{height}">'
        f'<g class="edges">{"".join(edges)}</g><g class="nodes">{"".join(boxes)}</g></svg>'
    )


def _stroke(k: int) -> str:
    return f"hsl({(k * 137.508) % 360:.1f},55%,38%)"


def _box(i: int, n: DrawNode, x: float, y: float) -> str:
    fill = kernel_colour(n.kernels[0]) if n.kernels else "#ffffff"
    cls = "n" + (" multi" if len(n.kernels) > 1 else "") + (" out" if n.output else "")
    tag = f"k{n.kernels[0]}" + ("+" if len(n.kernels) > 1 else "") if n.kernels else ""
    label = n.label if len(n.label) <= 13 else n.label[:12] + "\u2026"
    return (
        f'<g class="{cls}" data-k="{" ".join(map(str, n.kernels))}" transform="translate({x},{y})">'
        f"<title>{escape(n.title)}</title>"
        f'<rect width="{NODE_W}" height="{NODE_H}" rx="3" fill="{fill}"/>'
        f'<text x="4" y="13">{escape(label)}</text>'
        f'<text class="k" x="{NODE_W - 3}" y="13">{tag}</text></g>'
    )
