"""`spmdlang ops`: every primitive of the op table, its sharding rule and its one-line doc.

A rule depends on the shapes and attributes it is applied to, so each entry's rule is shown on the
entry's own example instance (OpDef.example).
"""

from __future__ import annotations

from .ir import registry
from .ir.printer import format_attrs
from .ir.types import TensorType


def _example(op: registry.OpDef):
    if op.example is None:
        return None, None, None
    texts, attrs = op.example
    operands = [TensorType.parse(t) for t in texts]
    results = op.infer_types(operands, attrs)
    return operands, attrs, results


def op_entry(op: registry.OpDef) -> dict:
    """One primitive as a JSON-able dict."""
    operands, attrs, results = _example(op)
    rule = op.rule(operands, list(results), attrs) if op.rule is not None and operands is not None else None
    partial = "depends on attributes" if callable(op.partial) else (str(op.partial) if op.partial else None)
    return {
        "name": op.name,
        "family": str(op.family),
        "stage": str(op.stage),
        "doc": op.doc,
        "example": None if operands is None else {
            "operands": [str(t) for t in operands], "attrs": format_attrs(attrs).strip(),
            "results": [str(t) for t in results]},
        "rule": None if rule is None else str(rule),
        "factor_sizes": None if rule is None else rule.sizes_text(),
        "custom_partition": op.partition is not None,
        "partial": partial,
        "reduce_kind": str(op.reduce_kind) if op.reduce_kind else None,
    }


def ops_report() -> list[dict]:
    return [op_entry(op) for op in registry.OPS.values()]


def render_ops(entries: list[dict]) -> str:
    """Plain text: per primitive a header line (name, family, rule) and the doc under it."""
    width = max(len(e["name"]) for e in entries)
    fam = max(len(e["family"]) for e in entries)
    lines = []
    for e in entries:
        if e["rule"] is not None:
            ex = e["example"]
            what = f"{e['rule']}   on {', '.join(ex['operands']) or '()'}{' ' + ex['attrs'] if ex['attrs'] else ''}"
            if e["custom_partition"]:
                what += "   + custom partition step"
        else:
            what = "per-partition programs only" if e["stage"] == "local" else "no factor rule"
        lines.append(f"{e['name']:<{width}}  {e['family']:<{fam}}  {what}")
        lines.append(f"{'':<{width}}  {'':<{fam}}  {e['doc']}")
    return "\n".join(lines) + "\n"
