"""`korch explain --html`: one self-contained page (inline CSS, SVG and script; no network)."""

from __future__ import annotations

import json
from html import escape

from korch.cli.explain import (
    alternative_text,
    ceilings_text,
    greedy_text,
    measured_text,
    names_text,
    profiling_text,
    rate_text,
)
from korch.cli.explain_svg import kernel_colour, layout, plan_nodes, svg

CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 6px}h2{font-size:15px;margin:18px 0 6px}
.summary td{padding:1px 10px 1px 0}.muted{color:#777}
#wrap{border:1px solid #ccc;overflow:auto;max-height:min(78vh,1300px);background:#fcfcfc}
#graph .e{fill:none;stroke-width:1.2;opacity:.55}#graph .e.in{stroke-width:2;opacity:.9}
#graph .e.wrap{stroke-dasharray:4 4;opacity:.3}
#graph .n rect{stroke:#555;stroke-width:.6}#graph .n.out rect{stroke:#000;stroke-width:2}
#graph .n.multi rect{stroke-dasharray:3 2;stroke-width:1.4}
#graph text{font:10px ui-monospace,monospace;fill:#111}#graph text.k{text-anchor:end;fill:#444;font-size:8px}
#graph.focus .n{opacity:.15}#graph.focus .e{opacity:.06}#graph.focus .n.hl{opacity:1}
.legend{display:flex;flex-wrap:wrap;gap:3px 10px;margin:6px 0;max-height:120px;overflow:auto}
.legend span{cursor:default;white-space:nowrap}.sw{display:inline-block;width:11px;height:11px;
border:1px solid #555;vertical-align:-1px;margin-right:3px}
table.k{border-collapse:collapse;width:100%}table.k th,table.k td{border-bottom:1px solid #e3e3e3;
padding:3px 6px;text-align:left;vertical-align:top}table.k td.r,table.k th.r{text-align:right}
.bar{display:inline-block;height:8px;background:#4a7bd0;vertical-align:0}
.alt{color:#555;font-size:12px}table.k td:last-child{width:30%}table.k td:nth-child(4){max-width:340px}
.tools button{margin-right:4px}
"""

NO_GRAPH = "This plan has no saved primitive graph: each kernel's own primitives are drawn."

RATE_NOTE = (
    "Achieved: FLOP rate (2 FLOPs per multiply-add of the linear primitives) for kernels that hold "
    "one, else bytes read and written per second; the percentage compares it with the ceilings "
    "measured at optimize time (a large copy and a large fp32 matmul through torch). Kernels whose "
    "data stay in cache, or whose library beats torch's matmul, go past 100%."
)

SCRIPT = """
(function(){
var g=document.getElementById('graph'),scale=1;
function zoom(f){scale=f===0?Math.min(1,document.getElementById('wrap').clientWidth/g.dataset.w):scale*f;
 g.setAttribute('width',g.dataset.w*scale);g.setAttribute('height',g.dataset.h*scale);}
document.querySelectorAll('.tools button').forEach(function(b){
 b.addEventListener('click',function(){zoom(parseFloat(b.dataset.z));});});
function focus(k){g.classList.toggle('focus',k!==null);
 g.querySelectorAll('.n').forEach(function(n){
  n.classList.toggle('hl',k!==null&&n.dataset.k.split(' ').indexOf(k)>=0);});}
document.querySelectorAll('[data-kernel]').forEach(function(el){
 el.addEventListener('mouseenter',function(){focus(el.dataset.kernel);});
 el.addEventListener('mouseleave',function(){focus(null);});});
document.documentElement.setAttribute('data-explain','ready:'+g.querySelectorAll('.n').length);
})();
"""


def _summary(r: dict) -> str:
    s = r["solver"]
    rows = [
        ("plan", f"{escape(r['plan'])}: {len(r['kernels'])} kernels over {r['primitives']} primitives"),
        ("device", f"{escape(str(r['device']))} ({escape(str(r['device_name']))})"),
        ("predicted", f"{r['predicted_ms']:.4f} ms (sum of measured kernel latencies)"),
        ("measured in place", measured_text(r) if r["measured"] else "-"),
        ("greedy baseline", greedy_text(r)),
        (
            "solver",
            f"{escape(str(s.get('status', '?')))}, gap {s.get('gap', 0):g}, "
            f"{s.get('seconds', 0):.2f} s, {s.get('cycle_cuts', 0)} cycle cuts",
        ),
        ("profiling", profiling_text(r["profiling"])),
        ("backends", escape(", ".join(f"{b} {n}" for b, n in r["backends"].items()))),
    ]
    if r["ceilings"]:
        rows.append(("ceilings", ceilings_text(r["ceilings"])))
    rows += [("rewrite", escape(line)) for line in r["rewrites"]]
    body = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="summary">{body}</table>'


def _swatch(k: int) -> str:
    return f'<i class="sw" style="background:{kernel_colour(k)}"></i>'


def _legend(r: dict) -> str:
    items = [
        f'<span data-kernel="{k["index"]}">{_swatch(k["index"])}'
        f"k{k['index']} {escape(k['backend'])} {k['ms']:.3f} ms</span>"
        for k in r["kernels"]
    ]
    return '<div class="legend">' + "".join(items) + "</div>"


def _kernel_row(k: dict) -> str:
    share = k["share"] or 0.0
    alts = "".join(f'<div class="alt">{escape(alternative_text(a))}</div>' for a in k["alternatives"])
    origins = escape(names_text(k["origins"], 6)) if k["origins"] else ""
    return (
        f'<tr data-kernel="{k["index"]}"><td>{_swatch(k["index"])}k{k["index"]}</td>'
        f'<td>{escape(k["backend"])}</td><td class="r">{k["primitives"]}</td>'
        f'<td>{escape(names_text(k["names"], 10))}<div class="muted">{origins}</div></td>'
        f'<td class="r">{k["ms"]:.4f}{_in_place(k)}</td><td class="r">{share:.1%} '
        f'<span class="bar" style="width:{max(1, round(share * 60))}px"></span></td>'
        f"<td>{escape(rate_text(k))}</td><td>{alts or '<span class=muted>none recorded</span>'}</td></tr>"
    )


def _in_place(k: dict) -> str:
    ms = k["in_place_ms"]
    return (
        "" if ms is None else f'<div class="muted" title="timed in place, the plan run whole">{ms:.4f}</div>'
    )


def _kernel_table(r: dict) -> str:
    head = (
        "<tr><th>kernel</th><th>backend</th><th class=r>prims</th><th>primitives (origins)</th>"
        "<th class=r>ms<div class=muted>in place</div></th><th class=r>share</th><th>achieved</th>"
        "<th>rejected alternatives</th></tr>"
    )
    note = f"<p class=muted>{RATE_NOTE}</p>" if r["ceilings"] else ""
    return f'<table class="k">{head}{"".join(_kernel_row(k) for k in r["kernels"])}</table>{note}'


def _pruned(r: dict) -> str:
    c = r["candidates"]
    lines = [
        f"{c.get('candidates', '?')} candidates ({c.get('unique_candidates', '?')} unique, "
        f"{c.get('seeds', 0)} seeds) in {c.get('partitions', '?')} partitions."
    ]
    rows = "".join(f"<tr><td>{escape(k)}</td><td class=r>{v}</td></tr>" for k, v in r["pruned"].items())
    head = "<tr><th>reason</th><th class=r>pruned</th></tr>"
    table = f'<table class="k" style="width:auto">{head}{rows}</table>'
    return f"<p>{' '.join(lines)}</p>" + (table if rows else "<p class=muted>nothing pruned</p>")


def page(plan, r: dict) -> str:
    """The whole report page for a plan and its report (korch.cli.explain.report)."""
    nodes = plan_nodes(plan)
    drawing = svg(nodes, layout(nodes))
    note = "" if r["has_graph"] else f"<p class=muted>{NO_GRAPH}</p>"
    data = json.dumps(r).replace("</", "<\\/")
    return (
        "<!DOCTYPE html><html><head><meta charset=utf-8>"
        f"<title>korch explain {escape(r['plan'])}</title><style>{CSS}</style></head><body>"
        f"<h1>korch explain</h1>{_summary(r)}"
        f"<h2>Primitive graph, coloured by kernel ({len(nodes)} nodes)</h2>{note}"
        '<div class="tools"><button data-z="1.25">zoom in</button><button data-z="0.8">zoom out</button>'
        '<button data-z="0">fit width</button> <span class=muted>hover a node for its shape; hover a '
        "kernel in the legend or the table to highlight it; bold outline: graph output; dashed: "
        "recomputed in several kernels</span></div>"
        f'{_legend(r)}<div id="wrap">{drawing}</div>'
        f"<h2>Kernels</h2>{_kernel_table(r)}<h2>Pruned candidates</h2>{_pruned(r)}"
        f'<script type="application/json" id="report">{data}</script><script>{SCRIPT}</script>'
        "</body></html>"
    )
