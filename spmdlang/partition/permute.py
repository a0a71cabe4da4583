"""Source -> destination pairs of a collective_permute, from a symbolic rule.

The compiler never lists per-device pairs: a collective_permute carries a rule, and this function
expands it at run time (the simulator) or trace time (the emitted jax module embeds this file's
function verbatim), so compile time does not grow with the number of devices.

Rules, over the linear index of a group (its axes' sizes `sizes`, first axis major):
  ("shift", offset, wrap)   i -> i + offset; with wrap modulo the group size, else dropped off the
                            ends (receivers without a sender get zeros, as jax.lax.ppermute does)
  ("relayout", axes, src, dst)   src/dst: per tensor dim, the axes splitting it. The device that
                            holds a block under `dst` receives it from one that holds it under
                            `src`; devices holding the same block (replicas) are matched in order,
                            so the map is a bijection whenever both layouts have equal shard counts.
                            A layout may name sub-axes "x:s:m" (digit (x // s) % m of axis x).
  ("shift", offset, wrap, group, axes)   the shift above of the index over `group` (axes and
                            sub-axes of `axes`), the other digits kept: a group no jax axis names.

Group indices here follow the collective's axes in the order written (first axis major), as
`jax.lax.axis_index(axes)`, `all_gather` and `all_to_all` count. `jax.lax.ppermute(x, axes, perm)`
does not: it numbers a group's devices by its axes in MESH order, whatever the order of `axes`
(`ppermute(x, ('q', 'p'), ...)` on mesh [p, q] counts p major). `mesh_order_pairs` renumbers pairs
for it; the emitted jax module applies it to every permute over several axes.
"""

from __future__ import annotations


def permute_pairs(rule, sizes):
    """[(source index, destination index)] within a group; pure Python, no imports needed."""
    k = 1
    for s in sizes:
        k *= s
    if rule[0] == "shift" and len(rule) == 3:
        _, offset, wrap = rule
        if wrap:
            return [(i, (i + offset) % k) for i in range(k)]
        return [(i, i + offset) for i in range(k) if 0 <= i + offset < k]
    axes = rule[-1] if rule[0] == "shift" else rule[1]
    size = dict(zip(axes, sizes))

    def extent(a):  # a mesh axis, or a sub-axis "x:s:m" (digit (x // s) % m)
        return size[a] if a in size else int(a.split(":")[2])

    def digit(c, a):
        if a in c:
            return c[a]
        p, s, m = a.split(":")
        return c[p] // int(s) % int(m)

    def coords(i):
        out = {}
        for a in reversed(axes):
            out[a] = i % size[a]
            i //= size[a]
        return out

    def linear(c, names):
        n = 0
        for a in names:
            n = n * extent(a) + digit(c, a)
        return n

    if rule[0] == "shift":  # ("shift", offset, wrap, group, axes): a shift of the index over `group`
        _, offset, wrap, group, _ = rule
        kg = 1
        for a in group:
            kg *= extent(a)
        out = []
        for i in range(k):
            c = coords(i)
            t = linear(c, group) + offset
            if wrap:
                t %= kg
            elif not 0 <= t < kg:
                continue
            for a in reversed(group):
                d, t = t % extent(a), t // extent(a)
                if a in c:
                    c[a] = d
                else:
                    p, s, _ = a.split(":")
                    c[p] += (d - digit(c, a)) * int(s)
            out.append((i, linear(c, axes)))
        return out
    _, axes, src, dst = rule

    def key(c, layout):
        used = {a for d in layout for a in d}
        rest = 0  # the linear index over the digits no dim of the layout uses tells replicas apart
        for p in axes:
            if p in used:
                continue
            subs = sorted((int(a.split(":")[1]), int(a.split(":")[2])) for a in used if a.split(":")[0] == p)
            base = 1
            for s, m in subs + [(size[p], 1)]:
                rest = rest * (s // base) + c[p] // base % (s // base)
                base = s * m
        return tuple(linear(c, d) for d in layout) + (rest,)

    holder = {key(coords(i), src): i for i in range(k)}
    return [(holder[key(coords(j), dst)], j) for j in range(k)]


def mesh_order_pairs(pairs, axes, sizes, mesh_axes):
    """Renumber (source, destination) pairs from group indices over `axes` in the order given to
    indices over the same axes in mesh order (`mesh_axes`), the numbering jax.lax.ppermute uses."""
    order = sorted(range(len(axes)), key=lambda i: list(mesh_axes).index(axes[i]))

    def renumber(i):
        digits = [0] * len(sizes)
        for j in reversed(range(len(sizes))):
            digits[j] = i % sizes[j]
            i //= sizes[j]
        n = 0
        for j in order:
            n = n * sizes[j] + digits[j]
        return n

    return [(renumber(s), renumber(d)) for s, d in pairs]
