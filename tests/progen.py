"""Random spmdlang programs for differential tests: a chain of ops drawn from the op table.

`Generator(chooser).program()` returns the .spmd source text of one program: a mesh of 1-3 axes
(sizes 1-4, sometimes an explicit device order), parameters with random shardings, 2-8 statements
drawn from the builtins (elementwise with broadcasting and scalars, matmul/einsum with batch and
contracting dims, reductions, arg-reductions, scans, top_k, sort/argsort, softmax/logsumexp, jax.nn's
activations, layout ops, slicing, concat, pad, roll, take, take_along_axis, scatter_add/max/min,
one_hot, iota, where, cast, logical ops, conv, max_pool/avg_pool, random_uniform/random_normal/dropout,
dynamic indexing x[l], dynamic_slice/dynamic_update_slice with value and static starts) and random `shard()`
constraints, open `?` dims included; with `loops=True`, also `loop` statements (nested up to two
deep) carrying a value with a random sharding through random ops, reading rows at the loop index
(x[i], take, and the dynamic ops, which find the index among the integer values).
tests/test_coverage.py fails when an op of the op table can not come out of it.
Dims are mostly small primes so uneven sharding is the common case.

The chooser is either hypothesis-driven (`HypothesisChooser`, shrinks well) or a seeded
`random.Random` (`RandomChooser`, for long standalone sweeps). Every generated program must
compile: a SpmdError from one is a bug in this generator or in the frontend.

Exactness: a value is "exact" when the sharded computation gives bit-identical results to the
reference (no float sum whose order depends on the sharding). Only exact values feed ops that turn
floats into discrete answers (comparisons, argmax, casts to ints, floor), so a legitimate rounding
difference can never flip an integer result and fail a test spuriously.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from math import prod

# Patterns the generator avoids because of open bugs, each reproduced by an xfail test in
# tests/test_plans.py (named here). Delete an entry when its bug is fixed. (None open.)
KNOWN_BUGS: dict[str, str] = {}

AXIS_NAMES = ("p", "q", "r")
DIMS = (3, 5, 7, 3, 5, 7, 2, 4, 6, 1, 8)  # weighted towards odd/prime sizes
MAX_ELEMS = 2048
MAX_RANK = 4


class RandomChooser:
    def __init__(self, seed: int):
        self.r = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def choice(self, seq):
        return seq[self.r.randrange(len(seq))]

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def perm(self, items):
        items = list(items)
        self.r.shuffle(items)
        return items


class HypothesisChooser:
    """Draws through hypothesis, so failing programs shrink to small ones."""

    def __init__(self, draw):
        from hypothesis import strategies as st

        self.draw, self.st = draw, st

    def int(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))

    def choice(self, seq):
        return seq[self.int(0, len(seq) - 1)]

    def chance(self, p: float) -> bool:
        # integers shrink towards 0: "False" is the simpler program
        return self.int(0, 999) >= 1000 * (1 - p)

    def perm(self, items):
        items = list(items)
        out = []
        while items:
            out.append(items.pop(self.int(0, len(items) - 1)))
        return out


@dataclass(frozen=True)
class Val:
    name: str
    shape: tuple[int, ...]
    dtype: str  # f32 bf16 i32 bool
    exact: bool = True

    @property
    def is_float(self) -> bool:
        return self.dtype in ("f32", "bf16")

    @property
    def numeric(self) -> bool:
        return self.dtype != "bool"

    @property
    def size(self) -> int:
        return prod(self.shape)


# Functions that XLA computes with its own approximations, not bit-identical to numpy's: its f32
# tanh saturates to 1.0 from |x| = 8, numpy's past 9, and 60% of its results differ in the last
# bits, so ties and floors that argmax, top_k, sort and casts read can break differently (seed
# 1100196 of the grad/loop generator was such a false alarm). Their results are not exact: no
# discrete answer (comparison, floor, argmax, cast to int) is drawn from them. Real errors there
# still show: the values themselves are compared to a tolerance. sqrt and division are correctly
# rounded everywhere.
_APPROXIMATE = re.compile(r"\b(tanh|atan2|sigmoid|log_sigmoid|gelu|sin|cos|exp|log|rsqrt|pow|erf|erf_inv|log1p|expm1|"
                          r"softplus|silu|swish|elu|celu|selu|softmax|log_softmax|logsumexp|standardize)\(")


def _portable(expr: str) -> bool:
    """Whether `expr` (a generator form) computes bit-identical results on every backend."""
    return not _APPROXIMATE.search(expr)


def _ty(dtype, shape) -> str:
    return f"{dtype}[{', '.join(map(str, shape))}]"


def _broadcast(a, b):
    out = []
    for x, y in zip(((1,) * (len(b) - len(a)) + tuple(a)), ((1,) * (len(a) - len(b)) + tuple(b))):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out)


class Generator:
    def __init__(self, ch, max_devices: int = 24, min_ops: int = 2, max_ops: int = 8, exclude=(), grad=False,
                 loops=False, wild=False):
        self.ch = ch
        # `wild`: ids and starts are sometimes i64 parameters (off by default: it draws more, and
        # tests pin programs by seed); feed such programs `hostile_inputs`
        self.wild = wild
        self.index_params: set[str] = set()  # parameters used as ids or starts
        self.grad = grad  # grad_program() draws stop_gradient too
        # `loop` statements too (off by default: a new op would change every seed's program, and
        # tests pin programs by seed)
        self.loops = loops
        self.exclude = frozenset(exclude)
        self.max_devices, self.min_ops, self.max_ops = max_devices, min_ops, max_ops
        self.params: list[tuple[Val, str | None]] = []
        self.lines: list[str] = []
        self.pool: list[Val] = []
        self.counter = 0
        self.uses_bf16 = False
        self.in_loop = 0

    # ------------------------------------------------------------------ basics

    def mesh(self) -> str:
        n = self.ch.int(1, 3)
        sizes = []
        for _ in range(n):
            room = self.max_devices // max(1, prod(sizes))
            sizes.append(self.ch.int(1, max(1, min(4, room))))
        self.axes = dict(zip(AXIS_NAMES, sizes))
        text = "mesh [" + ", ".join(f"{a}={s}" for a, s in self.axes.items()) + "]"
        total = prod(sizes)
        if total > 1 and self.ch.chance(0.3):
            text += " devices [" + ", ".join(map(str, self.ch.perm(range(total)))) + "]"
        return text

    def dim(self) -> int:
        return self.ch.choice(DIMS)

    def shape(self, rank=None) -> tuple[int, ...]:
        rank = self.ch.int(1, 3) if rank is None else rank
        return tuple(self.dim() for _ in range(rank))

    def spec(self, rank: int, open_ok: bool = False) -> str:
        """A random valid sharding spec: each axis used at most once, tuples for several axes."""
        free = list(self.axes)
        parts = []
        for _ in range(rank):
            r = self.ch.int(0, 9)
            if open_ok and r == 9:
                parts.append("?")
                continue
            k = 0 if r < 4 or not free else (1 if r < 8 or len(free) < 2 else 2)
            chosen = []
            for _ in range(k):
                chosen.append(free.pop(self.ch.int(0, len(free) - 1)))
            text = chosen[0] if len(chosen) == 1 else "(" + ", ".join(chosen) + ")"
            parts.append(text if chosen else "_")
        return "{" + ", ".join(parts) + "}"

    def fresh_name(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    def param(self, shape, dtype="f32", spec="random") -> Val:
        v = Val(f"in{len(self.params)}", tuple(shape), dtype)
        if spec == "random":
            spec = self.spec(len(shape)) if shape and self.ch.chance(0.75) else None
        self.params.append((v, spec))
        if dtype == "bf16":
            self.uses_bf16 = True
        return v

    def assign(self, expr: str, shape, dtype: str, exact: bool) -> Val:
        v = Val(self.fresh_name(), tuple(shape), dtype, exact)
        self.lines.append(f"  {v.name} = {expr}")
        self.pool.append(v)
        return v

    def pick(self, pred=lambda v: True) -> Val | None:
        """The latest value (a chain) most of the time, else any value that fits."""
        fits = [v for v in self.pool if pred(v)]
        if not fits:
            return None
        if self.ch.chance(0.6):
            return fits[-1]
        return self.ch.choice(fits)

    def small(self, shape) -> bool:
        return prod(shape) <= MAX_ELEMS and len(shape) <= MAX_RANK

    # ------------------------------------------------------------------ ops

    def op_unary(self):
        v = self.pick()
        if v.dtype == "bool":
            return self.assign(f"logical_not({v.name})", v.shape, "bool", v.exact)
        if v.dtype == "i32":
            fn = self.ch.choice(["neg", "abs", "sign"])
            return self.assign(f"{fn}({v.name})", v.shape, "i32", v.exact)
        forms = ["neg({})", "abs({})", "tanh({})", "sigmoid({})", "relu({})", "gelu({})", "sin({})",
                 "cos({})",
                 "exp(tanh({}))", "log(abs({}) + 1.0)", "sqrt(abs({}))", "rsqrt(abs({}) + 1.0)", "-{}"]
        if self.grad:
            forms.append("stop_gradient({})")
        if v.exact:
            forms += ["floor({} * 2.0)", "ceil({})", "round({} * 3.0)", "sign({})"]
        form = self.ch.choice(forms)
        return self.assign(form.format(v.name), v.shape, v.dtype, v.exact and _portable(form))

    def other_operand(self, a: Val) -> tuple[str, tuple[int, ...], bool] | None:
        """Something to combine with `a` elementwise: a scalar, a pool value, or a fresh parameter."""
        r = self.ch.int(0, 9)
        if r < 2:
            lits = ["2", "3", "1"] if a.dtype == "i32" else ["2.0", "0.5", "-1.5", "3"]
            lit = self.ch.choice(lits)
            return lit, a.shape, True
        if r < 5:
            fits = [v for v in self.pool if v.dtype == a.dtype and _broadcast(a.shape, v.shape) is not None
                    and self.small(_broadcast(a.shape, v.shape))]
            if fits:
                b = self.ch.choice(fits)
                return b.name, _broadcast(a.shape, b.shape), b.exact
        if r == 9 and a.shape:
            return f"zeros({_ty(a.dtype, a.shape)}) + 1", a.shape, True
        # a fresh parameter: a suffix of a's shape with some dims 1, or extra leading dims
        shape = list(a.shape[self.ch.int(0, len(a.shape)):]) if a.shape else []
        shape = [1 if self.ch.chance(0.2) else n for n in shape]
        if self.ch.chance(0.2) and len(a.shape) < MAX_RANK:
            shape = [self.dim()] + ([n for n in a.shape] if self.ch.chance(0.5) else shape)
        out = _broadcast(a.shape, tuple(shape))
        if out is None or not self.small(out):
            return None
        b = self.param(shape, a.dtype)
        return b.name, out, True

    def op_binary(self):
        a = self.pick(lambda v: v.numeric)
        if a is None:
            return None
        other = self.other_operand(a)
        if other is None:
            return None
        b, shape, exact = other
        literal = b[0].isdigit() or b[0] == "-"
        if a.dtype == "i32":
            form = self.ch.choice(["{} + {}", "{} - {}", "{} * {}", "maximum({}, {})", "minimum({}, {})"])
        else:
            form = self.ch.choice(["{} + {}", "{} - {}", "{} * {}", "maximum({}, {})", "minimum({}, {})",
                                   "{} * {} + 1.0", "pow(abs({}) + 0.5, {})", "atan2({}, {})"]
                                  + ([] if literal else ["{} / (abs({}) + 1.0)"]))
        exact = exact and _portable(form)
        if self.ch.chance(0.3):
            x, y = form.format(b, a.name), shape  # operands swapped: scalar on the left too
            return self.assign(x, y, a.dtype, a.exact and exact)
        return self.assign(form.format(a.name, b), shape, a.dtype, a.exact and exact)

    def op_unary_more(self):
        """The elementwise functions of version 2 (erf, log1p, expm1, square, exact gelu, clip)."""
        v = self.pick(lambda v: v.numeric)
        if v is None:
            return None
        if v.dtype == "i32":
            form = self.ch.choice(["square({})", "clip({}, -2, 3)"])
            return self.assign(form.format(v.name), v.shape, "i32", v.exact)
        form = self.ch.choice(["erf({})", "erf_inv(tanh({}) * 0.9)", "log1p(abs({}))", "expm1(tanh({}))",
                               "square({})",
                               "gelu({}, approximate=false)", "clip({}, -0.5, 0.5)"])
        return self.assign(form.format(v.name), v.shape, v.dtype, v.exact and form.startswith("clip"))

    def op_activation(self):
        """jax.nn's activations: elementwise ones, glu on an even dim, log_softmax and standardize
        over random axes."""
        a = self.pick(lambda v: v.is_float)
        if a is None:
            return None
        r = self.ch.int(0, 9)
        if r < 6:
            form = self.ch.choice(["softplus({})", "log_sigmoid({})", "silu({})", "swish({})", "relu6(4.0 * {})",
                                   "hard_tanh({})", "leaky_relu({})", "leaky_relu({}, negative_slope=0.2)",
                                   "elu({})", "elu({}, alpha=0.5)", "celu({}, alpha=2.0)", "selu({})"])
            return self.assign(form.format(a.name), a.shape, a.dtype, a.exact and _portable(form))
        even = [d for d, n in enumerate(a.shape) if n % 2 == 0]
        if r < 8 and even:
            ax = self.ch.choice(even)
            shown = ax - len(a.shape) if self.ch.chance(0.5) else ax
            shape = tuple(n // 2 if d == ax else n for d, n in enumerate(a.shape))
            return self.assign(f"glu({a.name}, axis={shown})", shape, a.dtype, False)
        if not a.shape:
            return None
        arg, _ = self.axes_arg(len(a.shape))
        arg = arg or f", axis=[{', '.join(map(str, range(len(a.shape))))}]"
        if self.ch.chance(0.5):
            return self.assign(f"log_softmax({a.name}{arg})", a.shape, a.dtype, False)
        # an epsilon well above f32 rounding: standardize divides by the spread, and of nearly equal
        # values (sigmoid of values near 1, seed 3885) it amplifies an ulp of the mean, which a
        # split sum may round otherwise, past any tolerance (the default epsilon is 1e-5)
        eps = self.ch.choice([", epsilon=0.1", ", epsilon=0.01"])
        return self.assign(f"standardize({a.name}{arg}{eps})", a.shape, a.dtype, False)

    def op_floor_mod(self):
        """a // b and a % b: on ints (by 0 included), and on exact f32 values only, where a
        rounding difference cannot move a floor."""
        a = self.pick(lambda v: v.dtype == "i32" or v.dtype == "f32" and v.exact)
        if a is None:
            return None
        other = self.other_operand(a)
        if other is None:
            return None
        b, shape, exact = other
        op = self.ch.choice(["//", "%"])
        if a.dtype == "i32":
            return self.assign(f"{a.name} {op} {b}", shape, "i32", a.exact and exact)
        if not exact:
            return None
        return self.assign(f"{a.name} {op} (abs({b}) + 0.5)", shape, "f32", True)

    def op_compare_where(self):
        a = self.pick(lambda v: v.numeric and v.exact)
        if a is None:
            return None
        zero = "0" if a.dtype == "i32" else "0.0"
        cmp = self.ch.choice([">", "<", ">=", "<=", "==", "!="])
        other = self.ch.choice([zero, "1" if a.dtype == "i32" else "0.5"])
        cond = f"{a.name} {cmp} {other}"
        bools = [v for v in self.pool if v.dtype == "bool" and v.exact]
        if bools and self.ch.chance(0.3):
            a = self.ch.choice(bools)
            cond = a.name
        if self.ch.chance(0.3):
            return self.assign(cond, a.shape, "bool", True)
        x = self.pick(lambda v: v.numeric and _broadcast(v.shape, a.shape) is not None
                      and self.small(_broadcast(v.shape, a.shape)))
        if x is None:
            return None
        fill = "0" if x.dtype == "i32" else self.ch.choice(["0.0", "-1.0"])
        shape = _broadcast(x.shape, a.shape)
        y = self.ch.choice([fill, x.name])
        args = (x.name, y) if self.ch.chance(0.5) else (y, x.name)
        return self.assign(f"where({cond}, {args[0]}, {args[1]})", shape, x.dtype, x.exact)

    def op_logical(self):
        a = self.pick(lambda v: v.dtype == "bool" and v.exact)
        if a is None:
            return None
        b = self.pick(lambda v: v.dtype == "bool" and v.exact and _broadcast(v.shape, a.shape) is not None
                      and self.small(_broadcast(v.shape, a.shape)))
        fn = self.ch.choice(["logical_and", "logical_or"])
        return self.assign(f"{fn}({a.name}, {b.name})", _broadcast(a.shape, b.shape), "bool", True)

    def op_conv(self):
        """A convolution [N, spatial..., C] x [window..., C/groups, F], SAME, VALID or explicit
        padding, stride 1-2; sometimes atrous (rhs_dilation), transposed (lhs_dilation, explicit
        padding), grouped (depthwise when groups = C) or 3-D. A 3-D conv reads a fresh 5-D
        parameter and its result is summed over depth (values stay within MAX_RANK)."""
        a = self.pick(lambda v: v.dtype == "f32" and len(v.shape) in (3, 4))
        if a is None:
            return None
        nsp = len(a.shape) - 2
        window = tuple(self.ch.choice([1, 2, 3]) for _ in range(nsp))
        stride = self.ch.choice([1, 2])
        padding = self.ch.choice(["SAME", "VALID"])
        variant = self.ch.choice(["plain", "plain", "atrous", "transposed", "grouped", "3d"])
        x, xs = a.name, a.shape
        if variant == "3d":
            xs = (a.shape[0], *(self.ch.choice([2, 3, 4, 5]) for _ in range(3)), a.shape[-1])
            window = tuple(self.ch.choice([1, 2, 3]) for _ in range(3))
            nsp = 3
        lhs = 2 if variant == "transposed" else 1
        rhs = 2 if variant == "atrous" else 1
        c = xs[-1]
        groups = 1
        if variant == "grouped" and c > 1:
            groups = self.ch.choice([g for g in range(2, c + 1) if c % g == 0])
        f = groups * self.ch.choice([1, 2]) if groups > 1 else self.ch.choice([1, 2, 4])
        pads = []
        for k in window:
            keff = (k - 1) * rhs + 1
            pads.append([self.ch.int(0, keff - 1), self.ch.int(0, keff - 1)] if lhs > 1 else None)
        spatial = []
        for n, k, pad in zip(xs[1:-1], window, pads):
            keff = (k - 1) * rhs + 1
            if pad is not None:
                m = ((n - 1) * lhs + 1 + pad[0] + pad[1] - keff) // stride + 1
            else:
                m = -(-n // stride) if padding == "SAME" else (n - keff) // stride + 1
            if m < 1:
                return None
            spatial.append(m)
        shape = (xs[0], *spatial, f)
        if not self.small(shape[:1] + shape[2:] if variant == "3d" else shape) or prod(shape) > 4 * MAX_ELEMS:
            return None
        if variant == "3d":  # made only now that the conv fits (no parameter nothing uses)
            x = self.param(xs, "f32").name
        w = self.param(window + (c // groups, f), "f32")
        args = [x, w.name, str(stride), f'"{padding}"' if lhs == 1 else str(pads).replace("'", "")]
        if lhs > 1:
            args.append(f"lhs_dilation={lhs}")
        if rhs > 1:
            args.append(f"rhs_dilation={rhs}")
        if groups > 1:
            args.append(f"groups={groups}")
        expr = f"conv({', '.join(args)})"
        if variant == "3d":
            return self.assign(f"sum({expr}, 1)", shape[:1] + shape[2:], "f32", False)
        return self.assign(expr, shape, "f32", False)

    def contractible(self, v: Val) -> bool:
        return v.dtype == "f32" or v.dtype == "bf16" and "bf16_einsum" not in KNOWN_BUGS

    def op_matmul(self):
        a = self.pick(lambda v: self.contractible(v) and v.shape and len(v.shape) <= 3)
        if a is None:
            return None
        k = a.shape[-1]
        n = self.dim()
        r = self.ch.int(0, 3)
        if r == 0 and len(a.shape) >= 2:  # batched: w carries a's batch dims
            w = self.param(a.shape[:-2] + (k, n), a.dtype)
            shape = a.shape[:-1] + (n,)
        elif r == 1 and len(a.shape) >= 2:  # w on the left
            m = self.dim()
            w = self.param((m, a.shape[-2]), a.dtype)
            return self.assign(f"{w.name} @ {a.name}", a.shape[:-2] + (m, a.shape[-1]), a.dtype, False)
        else:
            w = self.param((k, n), a.dtype)
            shape = a.shape[:-1] + (n,)
        if not self.small(shape):
            return None
        return self.assign(f"{a.name} @ {w.name}", shape, a.dtype, False)

    def op_einsum(self):
        a = self.pick(lambda v: self.contractible(v) and v.shape)
        if a is None:
            return None
        letters = "abcdefgh"[: len(a.shape)]
        roles = [self.ch.choice(["batch", "contract", "free", "free"]) for _ in letters]
        if self.ch.chance(0.2):  # one-operand einsum: transpose and/or sum out dims
            keep = [c for c, r in zip(letters, roles) if r != "contract"]
            out = "".join(self.ch.perm(keep))
            shape = tuple(a.shape[letters.index(c)] for c in out)
            exact = a.exact and len(out) == len(letters)
            return self.assign(f'einsum("{letters}->{out}", {a.name})', shape, a.dtype, exact)
        new = [c for c in "stuvw"[: self.ch.int(0, 2)]]
        size = {c: n for c, n in zip(letters, a.shape)}
        size.update({c: self.dim() for c in new})
        w_letters = [c for c, r in zip(letters, roles) if r in ("batch", "contract")] + new
        w_letters = self.ch.perm(w_letters)
        out = [c for c, r in zip(letters, roles) if r in ("batch", "free")] + new
        out = "".join(self.ch.perm(out))
        shape = tuple(size[c] for c in out)
        if not self.small(shape) or len(w_letters) > MAX_RANK:
            return None
        w = self.param(tuple(size[c] for c in w_letters), a.dtype)
        ops = [f"{letters}", "".join(w_letters)]
        args = [a.name, w.name]
        if self.ch.chance(0.3):
            ops.reverse()
            args.reverse()
        return self.assign(f'einsum("{ops[0]},{ops[1]}->{out}", {args[0]}, {args[1]})', shape, a.dtype, False)

    def axes_arg(self, rank: int) -> tuple[str, tuple[int, ...]]:
        """An axis argument: an int (maybe negative), a list, or None (all)."""
        if self.ch.chance(0.15):
            return "", tuple(range(rank))
        axes = sorted({self.ch.int(0, rank - 1) for _ in range(self.ch.int(1, rank))})
        show = [a - rank if self.ch.chance(0.25) else a for a in axes]
        if len(axes) == 1 and self.ch.chance(0.5):
            return f", axis={show[0]}", tuple(axes)
        return f", axis=[{', '.join(map(str, show))}]", tuple(axes)

    def summable(self, v: Val) -> bool:
        return v.numeric and bool(v.shape) and (v.dtype != "bf16" or "bf16_sum" not in KNOWN_BUGS)

    def op_reduce(self):
        a = self.pick(self.summable)
        if a is None:
            return None
        kind = self.ch.choice(["sum", "max", "min", "mean", "prod"])
        arg, axes = self.axes_arg(len(a.shape))
        keep = self.ch.chance(0.3)
        shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape)) if keep else \
            tuple(n for i, n in enumerate(a.shape) if i not in axes)
        dtype = "f32" if kind == "mean" and a.dtype == "i32" else a.dtype
        exact = a.exact and (kind in ("max", "min") or a.dtype == "i32" and kind != "mean")
        if kind == "prod" and a.is_float:  # keep products near 1: they lose no precision then
            src = f"(1.0 + 0.1 * tanh({a.name}))"
        else:
            src = a.name
        return self.assign(f"{kind}({src}{arg}{', keepdims=true' if keep else ''})", shape, dtype, exact)

    def op_arg(self):
        a = self.pick(lambda v: v.numeric and v.exact and v.shape)
        if a is None:
            return None
        kind = self.ch.choice(["argmax", "argmin"])
        if self.ch.chance(0.15):
            return self.assign(f"{kind}({a.name})", (), "i32", True)
        ax = self.ch.int(0, len(a.shape) - 1)
        shown = ax - len(a.shape) if self.ch.chance(0.3) else ax
        keep = self.ch.chance(0.2)
        shape = tuple(1 if i == ax else n for i, n in enumerate(a.shape)) if keep else \
            tuple(n for i, n in enumerate(a.shape) if i != ax)
        src = f"relu({a.name})" if a.is_float and self.ch.chance(0.3) else a.name  # ties: first index wins
        keep_arg = ", keepdims=true" if keep else ""
        return self.assign(f"{kind}({src}, axis={shown}{keep_arg})", shape, "i32", True)

    def op_softmax(self):
        a = self.pick(lambda v: v.is_float and self.summable(v))
        if a is None:
            return None
        if self.ch.chance(0.5):
            ax = self.ch.int(-len(a.shape), len(a.shape) - 1)
            return self.assign(f"softmax({a.name}, axis={ax})", a.shape, a.dtype, False)
        arg, axes = self.axes_arg(len(a.shape))
        if not arg:
            arg, axes = ", axis=-1", (len(a.shape) - 1,)
        keep = self.ch.chance(0.3)
        shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape)) if keep else \
            tuple(n for i, n in enumerate(a.shape) if i not in axes)
        keep_arg = ", keepdims=true" if keep else ""
        return self.assign(f"logsumexp({a.name}{arg}{keep_arg})", shape, a.dtype, False)

    def op_scan(self):
        a = self.pick(lambda v: v.shape and v.dtype != "bf16")
        if a is None:
            return None
        kind = self.ch.choice(["cumsum", "cumprod", "cummax"])
        ax = self.ch.int(-len(a.shape), len(a.shape) - 1)
        rev = ", reverse=true" if self.ch.chance(0.4) else ""
        src = f"(1.0 + 0.1 * tanh({a.name}))" if kind == "cumprod" and a.is_float else a.name
        dtype = "i32" if a.dtype == "bool" and kind != "cummax" else a.dtype
        exact = a.exact and (kind == "cummax" or not a.is_float)
        return self.assign(f"{kind}({src}, {ax}{rev})", a.shape, dtype, exact)

    def op_einsum3(self):
        """A three-operand chain: the frontend picks the pairwise order."""
        a = self.pick(lambda v: len(v.shape) == 2 and v.dtype == "f32")
        if a is None:
            return None
        n, p = self.dim(), self.dim()
        b = self.param((a.shape[1], n))
        c = self.param((n, p))
        spec = self.ch.choice(["ij,jk,kl->il", "ij,jk,kl->li", "ij,jk,kl->ik"])
        out = {"il": (a.shape[0], p), "li": (p, a.shape[0]), "ik": (a.shape[0], n)}[spec[-2:]]
        return self.assign(f'einsum("{spec}", {a.name}, {b.name}, {c.name})', out, "f32", False)

    def op_pool(self):
        a = self.pick(lambda v: len(v.shape) in (3, 4) and v.dtype in ("f32", "i32"))
        if a is None:
            return None
        kind = self.ch.choice(["max", "avg"])
        win, stride = self.ch.int(1, 3), self.ch.int(1, 3)
        pad = self.ch.choice(["VALID", "SAME"])
        out = []
        for n in a.shape[1:-1]:
            if pad == "VALID":
                if n < win:
                    return None
                out.append((n - win) // stride + 1)
            else:
                out.append(-(-n // stride))
        shape = (a.shape[0], *out, a.shape[-1])
        dtype = "f32" if kind == "avg" else a.dtype
        pool = f'{kind}_pool({a.name}, {win}, {stride}, "{pad}")'
        if kind == "max" and a.dtype == "f32" and win >= 2:  # (no extra draw: the rest of a program stays)
            # the max pool's gradient (select_and_scatter_add), the pool itself as the cotangent
            return self.assign(f'max_pool_grad({a.name}, {pool}, {win}, {stride}, "{pad}")', a.shape, "f32", False)
        return self.assign(pool, shape, dtype, a.exact and kind == "max")

    def op_random(self):
        r = self.ch.int(0, 2)
        seed = self.ch.choice(["0", "7", "-3", "123456789"])
        if r == 2:
            a = self.pick(lambda v: v.dtype == "f32")
            if a is None:
                return None
            rate = self.ch.choice(["0.1", "0.5", "0"])
            return self.assign(f"dropout({a.name}, {rate}, {seed})", a.shape, "f32", a.exact)
        shape = self.shape()
        kind = "uniform" if r == 0 else "normal"
        if self.ch.int(0, 1):  # version 3: jax.random's builtins with a key
            return self.op_jax_random(seed)
        return self.assign(f"random_{kind}({seed}, {_ty('f32', shape)})", shape, "f32", kind == "uniform")

    def op_jax_random(self, seed: str):
        """A draw from a key (prng_key, random_split, fold_in); u32 bits meet the bitwise ops and
        leave as i32 (the pool holds no u32)."""
        key = self.ch.choice([f"prng_key({seed})", f"fold_in(prng_key({seed}), 5)",
                              f"random_split(prng_key({seed}), 3)[2]"])
        shape = self.shape()
        r = self.ch.int(0, 4)
        if r == 0:
            a = self.pick(lambda v: v.dtype == "f32")
            if a is not None:
                rate = self.ch.choice(["0.1", "0.5"])  # x / keep rounds as XLA's may not: inexact
                return self.assign(f"dropout({key}, {a.name}, {rate})", a.shape, "f32", False)
        if r <= 1:
            return self.assign(f"uniform({key}, {_ty('f32', shape)}, minval=-1.0, maxval=2.0)", shape, "f32", True)
        if r == 2:
            return self.assign(f"normal({key}, {_ty('f32', shape)})", shape, "f32", False)
        if r == 3:
            return self.assign(f"bernoulli({key}, 0.3, {_ty('bool', shape)})", shape, "bool", True)
        bits = f"random_bits({key}, {_ty('u32', shape)})"
        mixed = (f"bitwise_or(bitwise_and(right_shift({bits}, 7), bitwise_xor({bits}, 65535)), "
                 f"left_shift({bits}, 20))")
        return self.assign(f"cast(right_shift({mixed}, 1), i32)", shape, "i32", True)

    def op_top_k(self):
        a = self.pick(lambda v: v.shape and v.numeric and v.exact and v.dtype != "bf16")
        if a is None:
            return None
        k = self.ch.int(1, min(a.shape[-1], 4))
        shape = a.shape[:-1] + (k,)
        v, i = self.fresh_name(), self.fresh_name()
        self.lines.append(f"  {v}, {i} = top_k({a.name}, {k})")
        self.pool.append(Val(v, shape, a.dtype, True))
        self.pool.append(Val(i, shape, "i32", True))
        return self.pool[-1]

    def op_sort(self):
        a = self.pick(lambda v: v.shape and v.numeric and v.exact and v.dtype != "bf16")
        if a is None:
            return None
        kind = self.ch.choice(["sort", "argsort"])
        ax = self.ch.int(-len(a.shape), len(a.shape) - 1)
        arg = "" if ax == -1 and self.ch.chance(0.5) else f", {ax}"
        return self.assign(f"{kind}({a.name}{arg})", a.shape, a.dtype if kind == "sort" else "i32", True)

    def op_take_along(self):
        a = self.pick(lambda v: v.shape and v.dtype != "bool")
        if a is None:
            return None
        ax = self.ch.int(0, len(a.shape) - 1)
        shape = a.shape[:ax] + (self.dim(),) + a.shape[ax + 1:]
        if not self.small(shape):
            return None
        ids = self.index_param(shape)
        return self.assign(f"take_along_axis({a.name}, {ids.name}, {ax})", shape, a.dtype, a.exact)

    def op_scatter(self):
        a = self.pick(lambda v: v.shape and v.dtype in ("f32", "i32"))
        if a is None:
            return None
        ax = self.ch.int(0, len(a.shape) - 1)
        ids = self.index_param(self.shape(self.ch.int(0, 2)))
        ushape = a.shape[:ax] + ids.shape + a.shape[ax + 1:]
        if not self.small(ushape):
            return None
        upd = self.param(ushape, a.dtype)
        kind = ("scatter_add", "scatter_max", "scatter_min")[self.ch.int(0, 2)]
        return self.assign(f"{kind}({a.name}, {ids.name}, {upd.name}, axis={ax})", a.shape, a.dtype,
                           a.exact and (a.dtype == "i32" or kind != "scatter_add"))

    def op_transpose(self):
        a = self.pick(lambda v: len(v.shape) >= 2)
        if a is None:
            return None
        if self.ch.chance(0.2):
            return self.assign(f"transpose({a.name})", a.shape[::-1], a.dtype, a.exact)
        perm = self.ch.perm(range(len(a.shape)))
        return self.assign(f"transpose({a.name}, [{', '.join(map(str, perm))}])",
                           tuple(a.shape[p] for p in perm), a.dtype, a.exact)

    def op_reshape(self):
        a = self.pick(lambda v: v.shape)
        if a is None:
            return None
        shape = list(a.shape)
        r = self.ch.int(0, 4)
        if r <= 1 and len(shape) >= 2:  # merge adjacent dims
            i = self.ch.int(0, len(shape) - 2)
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
        elif r <= 3:  # split a dim into two factors
            cands = [i for i, n in enumerate(shape) if n in (4, 6, 8, 9, 10, 12, 14, 15, 21, 35)]
            if not cands or len(shape) >= MAX_RANK:
                return None
            i = self.ch.choice(cands)
            n = shape[i]
            f = self.ch.choice([d for d in range(2, n) if n % d == 0])
            shape[i:i + 1] = [f, n // f]
        else:
            shape = [prod(shape)]
        shown = list(shape)
        if self.ch.chance(0.3):
            shown[self.ch.int(0, len(shown) - 1)] = -1
        return self.assign(f"reshape({a.name}, [{', '.join(map(str, shown))}])", shape, a.dtype, a.exact)

    def op_broadcast(self):
        a = self.pick(lambda v: len(v.shape) < MAX_RANK)
        if a is None:
            return None
        ones = [i for i, n in enumerate(a.shape) if n == 1]
        if ones and self.ch.chance(0.5):
            shape = list(a.shape)
            shape[self.ch.choice(ones)] = self.dim()
        else:
            shape = [self.dim()] + list(a.shape)
        if not self.small(shape):
            return None
        return self.assign(f"broadcast_to({a.name}, [{', '.join(map(str, shape))}])", shape, a.dtype, a.exact)

    def op_expand_squeeze(self):
        ones_vals = [v for v in self.pool if 1 in v.shape]
        if ones_vals and self.ch.chance(0.5):
            a = self.ch.choice(ones_vals)
            axes = [i for i, n in enumerate(a.shape) if n == 1]
            ax = self.ch.choice(axes)
            if self.ch.chance(0.3):
                shape = tuple(n for n in a.shape if n != 1)
                return self.assign(f"squeeze({a.name})", shape, a.dtype, a.exact)
            shape = a.shape[:ax] + a.shape[ax + 1:]
            return self.assign(f"squeeze({a.name}, axis={ax})", shape, a.dtype, a.exact)
        a = self.pick(lambda v: len(v.shape) < MAX_RANK)
        if a is None:
            return None
        ax = self.ch.int(0, len(a.shape))
        shape = a.shape[:ax] + (1,) + a.shape[ax:]
        return self.assign(f"expand_dims({a.name}, {ax})", shape, a.dtype, a.exact)

    def op_slice(self):
        a = self.pick(lambda v: v.shape)
        if a is None:
            return None
        parts, shape = [], []
        for n in a.shape:
            r = self.ch.int(0, 6)
            if r <= 2 or n == 1 and r != 6:
                parts.append(":")
                shape.append(n)
            elif r == 6 and len(a.shape) > 1:  # an integer index drops the dim
                i = self.ch.int(-n, n - 1)
                parts.append(str(i))
            else:
                lo = self.ch.int(0, n - 1)
                hi = self.ch.int(lo + 1, n)
                step = self.ch.choice([1, 1, 2, 3])
                text = f"{lo}:{hi}" if step == 1 else f"{lo}:{hi}:{step}"
                if lo == 0 and self.ch.chance(0.3):
                    text = text[1:]
                parts.append(text)
                shape.append(-(-(hi - lo) // step))
        return self.assign(f"{a.name}[{', '.join(parts)}]", shape, a.dtype, a.exact)

    def op_concat(self):
        a = self.pick(lambda v: v.shape)
        if a is None:
            return None
        ax = self.ch.int(0, len(a.shape) - 1)
        r = self.ch.int(0, 2)
        if r == 0:
            b = a
        else:
            fits = [v for v in self.pool if v.dtype == a.dtype and len(v.shape) == len(a.shape)
                    and all(x == y for i, (x, y) in enumerate(zip(v.shape, a.shape)) if i != ax)]
            if r == 1 and len(fits) > 1:
                b = self.ch.choice(fits)
            else:
                shape = list(a.shape)
                shape[ax] = self.dim()
                b = self.param(shape, a.dtype)
        shape = list(a.shape)
        shape[ax] += b.shape[ax]
        if not self.small(shape):
            return None
        items = [a.name, b.name] if self.ch.chance(0.5) else [b.name, a.name]
        shown = ax - len(shape) if self.ch.chance(0.3) else ax
        return self.assign(f"concat([{', '.join(items)}], axis={shown})", shape, a.dtype, a.exact and b.exact)

    def op_pad(self):
        a = self.pick(lambda v: v.shape and v.numeric)
        if a is None:
            return None
        side = lambda: self.ch.int(0, 3) if self.ch.chance(0.5) else 0  # noqa: E731
        widths = [[side(), side()] for _ in a.shape]
        if all(w == [0, 0] for w in widths):
            widths[0][1] = 1
        shape = [n + lo + hi for n, (lo, hi) in zip(a.shape, widths)]
        if not self.small(shape):
            return None
        value = self.ch.choice(["", ", value=0", ", value=-2"]) if a.dtype == "i32" else \
            self.ch.choice(["", ", value=1.5", ", value=-1.0"])
        text = ", ".join(f"[{lo}, {hi}]" for lo, hi in widths)
        return self.assign(f"pad({a.name}, [{text}]{value})", shape, a.dtype, a.exact)

    def op_roll(self):
        a = self.pick(lambda v: v.shape)
        if a is None or "roll" in KNOWN_BUGS:
            return None
        ax = self.ch.int(0, len(a.shape) - 1)
        shift = self.ch.int(-9, 9)
        if self.ch.chance(0.15):
            return self.assign(f"roll({a.name}, {shift})", a.shape, a.dtype, a.exact)
        return self.assign(f"roll({a.name}, {shift}, {ax})", a.shape, a.dtype, a.exact)

    def index_param(self, shape) -> Val:
        """A fresh parameter of ids or starts: i32, or now and then i64 in a wild program."""
        v = self.param(shape, "i64" if self.wild and self.ch.chance(0.3) else "i32")
        self.index_params.add(v.name)
        return v

    def int_value(self) -> Val:
        fits = [v for v in self.pool if v.dtype == "i32" and v.exact and len(v.shape) <= 2]
        if fits and self.ch.chance(0.5):
            return self.ch.choice(fits)
        return self.index_param(self.shape(self.ch.int(0, 2)))

    def op_take(self):
        a = self.pick(lambda v: v.shape and v.dtype != "bool")
        if a is None:
            return None
        ids = self.int_value()
        ax = self.ch.int(0, len(a.shape) - 1)
        shape = a.shape[:ax] + ids.shape + a.shape[ax + 1:]
        if not shape and "scalar_take" in KNOWN_BUGS:
            return None
        if not self.small(shape):
            return None
        arg = "" if ax == 0 and self.ch.chance(0.5) else f", axis={ax}"
        return self.assign(f"take({a.name}, {ids.name}{arg})", shape, a.dtype, a.exact)

    def int_scalar(self, index_of: int = 0) -> str:
        """An integer scalar start, or an index into a dim of `index_of`: a value (a parameter, or
        an exact one of the pool, sometimes shifted below 0) or, now and then, a static integer
        (out of range too for a start; an index must be in range)."""
        if self.ch.chance(0.15):
            return str(self.ch.int(-index_of, index_of - 1) if index_of else self.ch.int(-3, 9))
        fits = [v for v in self.pool if v.dtype == "i32" and v.exact and not v.shape]
        v = self.ch.choice(fits) if fits and self.ch.chance(0.4) else self.index_param(())
        return f"{v.name} - {self.ch.int(1, 9)}" if self.ch.chance(0.2) else v.name

    def op_dynamic_slice(self):
        """x[l] (mixed with static slices) or dynamic_slice(x, starts, sizes)."""
        a = self.pick(lambda v: v.shape)
        if a is None:
            return None
        if self.ch.chance(0.5) and len(a.shape) > 1:
            parts, shape = [], []
            for d, n in enumerate(a.shape):
                r = self.ch.int(0, 3)
                if d == 0 or r == 0:
                    parts.append(self.int_scalar(n))
                elif r == 1 and n > 1:
                    lo = self.ch.int(0, n - 1)
                    parts.append(f"{lo}:")
                    shape.append(n - lo)
                else:
                    parts.append(":")
                    shape.append(n)
            return self.assign(f"{a.name}[{', '.join(parts)}]", shape, a.dtype, a.exact)
        sizes = [self.ch.int(1, n) if self.ch.chance(0.7) else n for n in a.shape]
        starts = [self.int_scalar() for _ in a.shape]
        return self.assign(f"dynamic_slice({a.name}, [{', '.join(starts)}], {sizes})", sizes, a.dtype, a.exact)

    def op_dynamic_update(self):
        a = self.pick(lambda v: v.shape)
        if a is None:
            return None
        shape = tuple(self.ch.int(1, n) if self.ch.chance(0.7) else n for n in a.shape)
        upd = self.param(shape, a.dtype)
        starts = [self.int_scalar() for _ in a.shape]
        return self.assign(f"dynamic_update_slice({a.name}, {upd.name}, [{', '.join(starts)}])", a.shape, a.dtype,
                           a.exact)

    def op_one_hot(self):
        ids = self.int_value()
        n = self.ch.choice([3, 5, 7, 8, 16])
        shape = ids.shape + (n,)
        if not self.small(shape) or len(shape) > MAX_RANK:
            return None
        dt = self.ch.choice(["", ", dtype=f32", ", dtype=i32"])
        return self.assign(f"one_hot({ids.name}, {n}{dt})", shape, "i32" if "i32" in dt else "f32", True)

    def op_iota(self):
        a = self.pick(lambda v: v.shape and v.dtype in ("f32", "i32"))
        if a is None:
            return None
        ax = self.ch.int(0, len(a.shape) - 1)
        return self.assign(f"{a.name} + iota({_ty(a.dtype, a.shape)}, {ax})", a.shape, a.dtype, a.exact)

    def op_cast(self):
        a = self.pick()
        if a.dtype == "f32":
            if a.exact and self.ch.chance(0.4):
                to = self.ch.choice(["i32", "bool"])
                return self.assign(f"cast({a.name} * 3.0, {to})", a.shape, to, True)
            self.uses_bf16 = True
            return self.assign(f"cast({a.name}, bf16)", a.shape, "bf16", a.exact)
        if a.dtype == "bf16":
            return self.assign(f"cast({a.name}, f32)", a.shape, "f32", a.exact)
        to = self.ch.choice(["f32", "i32"]) if a.dtype == "bool" else "f32"
        if a.dtype == "i32" and not self.grad:  # through the float's bits and back: bitcast_convert_type,
            # no draw of its own (not in a gradient program: the grad tests rewrite f32 as f64)
            return self.assign(f"bitcast_convert_type(bitcast_convert_type(cast({a.name}, f32), u32), f32)",
                               a.shape, to, a.exact)
        return self.assign(f"cast({a.name}, {to})", a.shape, to, a.exact)

    def op_shard(self):
        a = self.pick(lambda v: v.shape)
        if a is None:
            return None
        spec = self.spec(len(a.shape), open_ok=True)
        return self.assign(f"shard({a.name}, {spec})", a.shape, a.dtype, a.exact)

    def op_loop(self):
        """A `loop` carrying one f32 value (laid out by a random shard()) through 1-3 random ops;
        the body reads the loop index (a cast, a row x[i] or take(x, i) of some value, and any op
        that draws an integer scalar)."""
        if self.in_loop >= 2:
            return None
        a = self.pick(lambda v: v.dtype == "f32" and v.shape)
        if a is None:
            return None
        # the body reads the carry as the updates below leave it: through tanh, not exact (XLA's tanh
        # differs from numpy's in the last bits, and floor(v * 2.0) of it jumped: seed 7041)
        carry = self.assign(f"shard({a.name}, {self.spec(len(a.shape))})", a.shape, "f32", False)
        saved = len(self.pool)
        idx = f"i{self.counter}"
        n = self.ch.int(0, 4)
        start = self.ch.int(0, 2) if self.ch.chance(0.3) else None
        rng = f"range({n})" if start is None else f"range({start}, {start + n})"
        self.lines.append(f"  loop {idx} in {rng} {{")
        self.in_loop += 1
        try:
            self.pool.append(Val(idx, (), "i32", True))  # ops needing an integer value may read the index
            rows = [v for v in self.pool if len(v.shape) >= 2 and v.dtype != "bool"]
            if rows and self.ch.chance(0.5):
                w = self.ch.choice(rows)
                row = f"{w.name}[{idx}]" if self.ch.chance(0.5) else f"take({w.name}, {idx})"
                self.assign(row, w.shape[1:], w.dtype, w.exact)
            for _ in range(self.ch.int(1, 3)):
                self.step()
        finally:
            self.in_loop -= 1
        body = [v for v in self.pool[saved:] if v.dtype == "f32" and _broadcast(v.shape, carry.shape) == carry.shape]
        b = self.ch.choice(body) if body else carry
        scale = self.ch.choice(["0.5", f"cast({idx}, f32) * 0.25"])
        if self.ch.chance(0.5):
            update = f"{carry.name} + tanh({b.name}) * {scale}"  # an accumulation
        else:
            update = f"tanh({b.name} + {carry.name}) * {scale}"
        self.lines.append(f"  {carry.name} = {update}")
        self.lines.append("  }")
        del self.pool[saved:]
        self.pool.remove(carry)
        assert not _portable(update)  # as the carry in the body was taken to be
        return self.assign(carry.name, carry.shape, "f32", False)

    OPS = (("unary", 3), ("binary", 4), ("compare_where", 2), ("matmul", 3), ("einsum", 3), ("reduce", 3),
           ("arg", 2), ("softmax", 2), ("transpose", 2), ("reshape", 3), ("broadcast", 1),
           ("expand_squeeze", 1), ("slice", 2), ("concat", 2), ("pad", 2), ("roll", 2), ("take", 2),
           ("one_hot", 1), ("iota", 1), ("cast", 2), ("shard", 4), ("logical", 1), ("conv", 1), ("scan", 2),
           ("unary_more", 2), ("floor_mod", 2), ("activation", 2),
           ("top_k", 1), ("sort", 1), ("take_along", 1), ("scatter", 1), ("einsum3", 1),
           ("pool", 1), ("random", 1), ("dynamic_slice", 1), ("dynamic_update", 1))

    def step(self):
        ops = self.OPS + ((("loop", 5),) if self.loops else ())
        names = [n for n, w in ops for _ in range(w) if n not in self.exclude]
        for _ in range(10):
            out = getattr(self, "op_" + self.ch.choice(names))()
            if out is not None:
                return out
        return self.op_unary()

    # ------------------------------------------------------------------ the program

    def _draw(self, first_dtype) -> tuple[str, str]:
        """(the mesh line, the drawn statements): a first parameter (its dtype drawn by
        `first_dtype()` after its shape), maybe a second f32 one, then min_ops..max_ops steps."""
        mesh = self.mesh()
        shape = self.shape()
        self.pool.append(self.param(shape, first_dtype()))
        if self.ch.chance(0.3):
            self.pool.append(self.param(self.shape(), "f32"))
        for _ in range(self.ch.int(self.min_ops, self.max_ops)):
            self.step()
        return mesh, "\n".join(self.lines)

    def program(self) -> str:
        mesh, body = self._draw(lambda: self.ch.choice(["f32"] * 6 + ["i32", "bf16"]))
        # return the last value and maybe other values nothing used (so no op is dead code)
        def after_definition(name: str) -> str:  # the body after `name = ...` (or `a, name = ...`)
            m = re.search(rf"^  [\w, ]*\b{name}\b[\w, ]* = ", body, re.M)
            return body[m.end():]

        unused = [v for v in self.pool[:-1] if v.name.startswith("v")
                  and not re.search(rf"\b{v.name}\b", after_definition(v.name))]
        results = [self.pool[-1]] + [v for v in unused if self.ch.chance(0.7)][:2]
        outs = []
        for v in results:
            spec = f" {self.spec(len(v.shape))}" if v.shape and self.ch.chance(0.4) else ""
            outs.append(f"{_ty(v.dtype, v.shape)}{spec}")
        params = ", ".join(f"{v.name}: {_ty(v.dtype, v.shape)}" + (f" {s}" if s else "")
                           for v, s in self.params)
        ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
        return (f"{mesh}\nfunc main({params}) -> {ret} {{\n{body}\n"
                f"  return {', '.join(v.name for v in results)}\n}}\n")

    def grad_program(self) -> str:
        """A program that differentiates (make the generator with grad=True): the drawn statements
        become `loss`, a function of every parameter returning sum(tanh(v)) of its last f32 value, and
        main returns value_and_grad (or grad) of it with respect to some f32 parameters."""
        mesh, body = self._draw(lambda: "f32")
        f32 = [v for v in self.pool if v.dtype == "f32"]
        # the loss sums what nothing else uses (the last f32 value and up to two dead ends)
        unused = [v for v in f32[:-1] if v.name.startswith("v")
                  and not re.search(rf"\b{v.name}\b", body.split(f"  {v.name} = ", 1)[-1])]
        terms = " + ".join(f"sum(tanh({v.name}))" for v in [f32[-1]] + unused[-2:])
        floats = [i for i, (v, _) in enumerate(self.params) if v.dtype == "f32"]
        argnums = [i for i in floats if self.ch.chance(0.6)] or [floats[0]]
        plain = ", ".join(f"{v.name}: {_ty(v.dtype, v.shape)}" for v, _ in self.params)
        params = ", ".join(f"{v.name}: {_ty(v.dtype, v.shape)}" + (f" {s}" if s else "") for v, s in self.params)
        grads = [self.params[i][0] for i in argnums]
        outs = []
        for v in grads:
            spec = f" {self.spec(len(v.shape))}" if v.shape and self.ch.chance(0.4) else ""
            outs.append(f"{_ty(v.dtype, v.shape)}{spec}")
        args = ", ".join(v.name for v, _ in self.params)
        names = [f"g{i}" for i in argnums]
        call = f"({args}, argnums=[{', '.join(map(str, argnums))}])"
        if self.ch.chance(0.5):
            lhs, fn, outs = ["l"] + names, "value_and_grad", ["f32[]"] + outs
        else:
            lhs, fn = names, "grad"
        ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
        call = fn + "(loss, " + call[1:]
        return (f"{mesh}\nfunc loss({plain}) -> f32[] {{\n{body}\n  return {terms}\n}}\n"
                f"func main({params}) -> {ret} {{\n  {', '.join(lhs)} = {call}\n"
                f"  return {', '.join(lhs)}\n}}\n")


# ---------------------------------------------------------------------------------- hostile inputs

_FAR_IDS = {"i32": (-2**31, 2**31 - 1, -1, -7, 40, 1000), "i64": (2**32, 2**32 + 1, -2**32, 2**40 + 3, 2**63 - 1,
                                                                   -2**63, -1, 40)}


def reassociates(src: str) -> bool:
    """Whether the program has an einsum of three or more operands: the partitioner may contract
    it in another pairwise order than the reference, and with infinities that is not only a
    rounding difference (inf * (-inf + 1) is -inf, inf * -inf + inf * 1 is NaN)."""
    return any(spec.split("->")[0].count(",") >= 2 for spec in re.findall(r'einsum\("([^"]*)"', src))


_MULTIPLYING = frozenset({"mul", "div", "einsum", "conv"})


def multiplies_pending_sums(compiled) -> bool:
    """Whether the plan multiplies a value that still owes a sum (a partial value, as GSPMD and
    XLA also do: x @ w distributes over the pending sum of x). Each shard's part holds zeros where
    another shard holds the numbers, and 0 * inf is NaN where inf * (sum of the parts) is not: with
    infinities that is IEEE arithmetic not surviving distributivity, not a wrong plan, so such
    programs are fed NaN only (NaN propagates alike either way)."""
    produced = compiled.spmd.produced

    def walk(ops) -> bool:
        for op in ops:
            if op.kind in _MULTIPLYING and any(getattr(produced.get(v), "partial", ()) for v in op.operands):
                return True
            if any(walk(r.ops) for r in op.regions):
                return True
        return False

    return walk(compiled.program.ops)


def special_floats(src: str, compiled=None) -> tuple[float, ...]:
    """The non-finite values hostile inputs may hold for program `src` (compiled as `compiled`):
    NaN and +-inf; NaN only where an einsum reassociates or the plan multiplies a pending sum;
    none where it convolves (ref, sim and jax multiply a conv's padding and dilation holes as
    zeros: 0 * inf and 0 * NaN are NaN there; the xla baseline's conv skips them in some forms:
    docs/known_xla_issues.md 10; tests/test_conv_general.py checks non-finite kernels on padding)."""
    if re.search(r"\bconv\(", src):
        return ()
    if reassociates(src) or (compiled is not None and multiplies_pending_sums(compiled)):
        return (float("nan"),)
    return (float("nan"), float("inf"), float("-inf"))


def hostile_inputs(prog, index_params=(), seed: int = 0, special=(float("nan"), float("inf"), float("-inf"))):
    """Inputs for a compiled program's parameters (`prog`: its IR program) as `random_inputs`
    gives them, made hostile: some float parameters get `special` values (NaN, +inf, -inf; pass
    `special_floats(src)`) at random places, and the ids and starts (`index_params`, e.g.
    Generator.index_params) get out-of-range values, negative and past the end, up to the
    extremes of their width. Most elements stay ordinary, so that results are still compared on
    real numbers."""
    import numpy as np

    from spmdlang.inputs import random_inputs

    rng = np.random.default_rng(seed)
    out = random_inputs(prog, seed)
    for p in prog.params:
        a = out[p.name].copy()
        if not a.size:
            continue
        flat = a.reshape(-1)
        kind = a.dtype.kind if a.dtype.name != "bfloat16" else "f"
        if kind == "f" and special and rng.random() < 0.4:
            hit = rng.random(flat.size) < 0.1
            hit[rng.integers(flat.size)] = True
            flat[hit] = rng.choice(np.array(special, np.float32), hit.sum()).astype(a.dtype)
        elif kind in "iu" and p.name in index_params:
            hit = rng.random(flat.size) < 0.4
            far = np.array(_FAR_IDS.get(str(p.value.type.dtype), _FAR_IDS["i32"]), dtype=a.dtype)
            flat[hit] = rng.choice(far, hit.sum())
        out[p.name] = a
    return out
