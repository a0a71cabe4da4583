"""A jaxpr as a .spmd function body: one statement per equation, in the language's builtins.

Values are written as placeholders (`\\x00ID\\x00`) while the body is built; the names are chosen
at the end (`render`), so the last value a user's line `h = ...` computes can be called `h`
whatever came after. One table, PRIMS, maps a primitive's name to the method that writes it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import SpmdError
from . import names as N

_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "i32", "bool": "bool",
          "float64": "f64", "int64": "i64", "uint32": "u32"}
_FLOATS = {"f32", "bf16", "f16", "f64"}
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_PLACEHOLDER = re.compile("\x00([0-9]+)\x00")
# a constant array up to this many elements that is not one repeated value still becomes a parameter
# (the language has no array literals); one repeated value is written as full(type, value)


class NoEquivalentError(SpmdError):
    """A jaxpr the importer cannot write: names the primitive and the user's line."""


def is_key(dtype) -> bool:
    """A typed threefry PRNG key (jax.random.key): the language's u32[..., 2] raw key."""
    return str(dtype) == "key<fry>"


def dtype_name(dtype, where=None) -> str:
    if is_key(dtype):
        return "u32"
    name = _DTYPE.get(np.dtype(dtype).name) if not str(dtype).startswith("key<") else None
    if name is None:
        raise NoEquivalentError(f"dtype {dtype} has no spmdlang equivalent (f32, bf16, f16, i32, u32, bool, f64, "
                           "i64; threefry keys)", where)
    return name


def aval_shape(aval) -> tuple:
    """The shape of the language's value for `aval` (a key's raw u32 words last)."""
    return tuple(int(d) for d in aval.shape) + ((2,) if is_key(aval.dtype) else ())


def type_text(aval, where=None) -> str:
    return f"{dtype_name(aval.dtype, where)}[{', '.join(str(d) for d in aval_shape(aval))}]"


def float_text(v: float) -> str:
    """A float literal the language reads back as `v` (in the value's own precision)."""
    v = float(v)
    if np.isinf(v):
        return "1e309" if v > 0 else "-1e309"
    text = str(np.float32(v)) if float(np.float32(v)) == v else repr(v)
    if "e" not in text and "." not in text:
        text += ".0"
    return text.replace("e+", "e")


def literal_text(value, dtype: str) -> str:
    if dtype == "bool":
        return "true" if bool(value) else "false"
    if dtype in _FLOATS:
        text = float_text(float(value))
    else:
        text = str(int(value))
    return f"({text})" if text.startswith("-") else text


@dataclass
class Ref:
    """A jaxpr atom as the body sees it: a named value (placeholder text) or a scalar literal."""

    text: str
    dtype: str
    shape: tuple
    literal: object = None  # the Python value of a scalar literal

    @property
    def is_literal(self) -> bool:
        return self.literal is not None


class Body:
    """The statements of one function body under construction, and the names chosen for values."""

    def __init__(self):
        self.lines: list[str] = []   # text with placeholders
        self.hints: dict[int, str] = {}  # value id -> wanted name
        self.count = 0
        self.fixed: dict[int, str] = {}  # value id -> name it must have (parameters)

    def new(self, hint: str | None = None, fixed: str | None = None) -> str:
        self.count += 1
        i = self.count
        if fixed is not None:
            self.fixed[i] = fixed
        elif hint:
            self.hints[i] = hint
        return f"\x00{i}\x00"

    def hint(self, text: str, name: str) -> None:
        m = _PLACEHOLDER.fullmatch(text)
        if m and int(m.group(1)) not in self.fixed:
            self.hints[int(m.group(1))] = name

    def hinted(self, text: str) -> bool:
        m = _PLACEHOLDER.fullmatch(text)
        return not m or int(m.group(1)) in self.hints or int(m.group(1)) in self.fixed

    def render(self, taken: set[str]) -> list[str]:
        chosen: dict[int, str] = dict(self.fixed)
        used = set(taken) | set(self.fixed.values())
        temp = 0
        for i in range(1, self.count + 1):
            if i in chosen:
                continue
            base = self.hints.get(i)
            if base:
                name, k = base, 1
                while name in used:
                    k += 1
                    name = f"{base}_{k}"
            else:
                while f"t{temp}" in used:
                    temp += 1
                name = f"t{temp}"
            used.add(name)
            chosen[i] = name
        return [_PLACEHOLDER.sub(lambda m: chosen[int(m.group(1))], line) for line in self.lines]


class Translator:
    """Writes the equations of a closed jaxpr into a Body (recursing into called jaxprs)."""

    def __init__(self, body: Body, const_param):
        self.body = body
        self.const_param = const_param  # (np.ndarray, where) -> Ref: a constant array as a parameter
        self.scalars: dict[tuple, str] = {}  # (dtype, shape, value repr) -> the placeholder of full(...)
        self.constant_lines: list[str] = []
        self.indent = "  "
        self.loops = 0
        self.frame = None
        self.where = None
        self.library = None  # the frame in an installed library (flax, optax) under self.where's line
        self.last_comment = None
        self.pending = None  # the comment naming the user's line of the next statement
        self.iotas: dict[str, int] = {}  # placeholder of an iota -> its axis (sort's argsort operand)
        self.known: dict[str, object] = {}  # placeholder of a full(type, v) constant -> v
        # how some u32 values were made (random_bits, >> 9, | 0x3F800000): jax.random's uniform
        # bits-to-float step, bitcast_convert_type, is then the language's uniform
        self.origin: dict[str, tuple] = {}
        # pads with interior padding written into the sum pool that is their one reader (jax's
        # gradient of a sum pool): id(pad eqn), and the placeholder text of each -> (operand, config)
        self.fold_pads: set[int] = set()
        self.deferred_pads: dict[str, tuple] = {}
        # sums of pads of one value (jax's transpose of strided slices added: the xla module's sum
        # pool): id(eqn) -> its writer (the root: one pool; the pads and inner adds: nothing)
        self.pool_sums: dict[int, object] = {}
        self.pad_operands: dict[int, Ref] = {}  # id(jaxpr var) -> its Ref, for those folded pads' writer

    # ------------------------------------------------------------------ emission

    def emit(self, expr: str, aval=None, hint: str | None = None) -> str:
        name = self.body.new(hint)
        self.line(f"{self.indent}{name} = {expr}")
        return name

    def line(self, text: str) -> None:
        """A line of the body, under the comment of the user's line it came from (if new)."""
        if self.pending is not None:
            if self.pending != self.last_comment:
                self.body.lines.append(f"{self.indent}# {self.pending}")
                self.last_comment = self.pending
            self.pending = None
        self.body.lines.append(text)

    def ref(self, name: str, aval) -> Ref:
        return Ref(name, dtype_name(aval.dtype, self.where), aval_shape(aval))

    def fail(self, message: str, note: str | None = None):
        lib = self.library
        if lib is not None:
            note = f"in {lib.file_name}:{lib.start_line}, which this line calls" + (f"; {note}" if note else "")
        raise NoEquivalentError(message, self.where, note)

    def constant(self, value, aval_dtype, where=None, materialize: bool = False) -> Ref:
        """A constant array: `full(type, v)` once per distinct (type, value), or a parameter. A
        scalar is a literal Ref (written where it is used) unless `materialize`."""
        arr = np.asarray(value)
        dt = dtype_name(arr.dtype, where or self.where)
        shape = tuple(arr.shape)
        if shape == () and not materialize and not (arr.dtype.kind == "f" and np.isnan(arr)):
            return Ref(literal_text(arr.item(), dt), dt, (), arr.item())
        if arr.size and np.all(arr == arr.flat[0]) | (np.isnan(arr).all() if arr.dtype.kind == "f" else False):
            v = arr.flat[0]
            key = (dt, shape, repr(v.item()), bool(np.signbit(v)))  # (NaNs of either sign)
            if key not in self.scalars:
                name = self.body.new(_const_hint(dt, shape, v))
                self.scalars[key] = name
                if arr.dtype.kind == "f" and np.isnan(v):  # inf * 0 is a NaN of either sign: make it v's
                    nan = f"abs(full({dt}[{', '.join(map(str, shape))}], 1e309) * 0.0)"
                    expr = f"-{nan}" if np.signbit(v) else nan
                else:
                    expr = f"full({dt}[{', '.join(map(str, shape))}], {literal_text(v, dt)})"
                self.constant_lines.append(f"  {name} = {expr}")
                self.known[name] = v.item()
            return Ref(self.scalars[key], dt, shape)
        return self.const_param(arr, where or self.where)

    def value(self, r: Ref) -> str:
        """A Ref as a value operand (a literal materialized as a named constant)."""
        if r.is_literal:
            return self.constant(np.asarray(r.literal, dtype=_np_dtype(r.dtype)), None, materialize=True).text
        return r.text

    # ------------------------------------------------------------------ jaxprs

    def run(self, jaxpr, consts: list, args: list[Ref]) -> list[Ref]:
        """Translate an (open) jaxpr with its constvars bound to `consts` (Refs) and invars to `args`."""
        from jax.extend import core as jcore

        env: dict = {}
        for v, r in zip(jaxpr.constvars, consts, strict=True):
            env[v] = r
        for v, r in zip(jaxpr.invars, args, strict=True):
            env[v] = r

        def read(a) -> Ref:
            if isinstance(a, jcore.Literal):
                val = np.asarray(a.val, dtype=a.aval.dtype)
                if val.shape == ():
                    return Ref(literal_text(val.item(), dtype_name(val.dtype, self.where)),
                               dtype_name(val.dtype, self.where), (), val.item())
                return self.constant(val, None)
            return env[a]

        # a user line `h = ...` names the last of its (forward) values that a later line reads
        last_of_line = _line_targets(jaxpr)
        self.fold_pads |= _pad_pool_folds(jaxpr)
        self.pool_sums.update(_pad_sum_pools(jaxpr))
        for i, eqn in enumerate(jaxpr.eqns):
            frame, own = N.user_frame(eqn), N.own_frame(eqn)
            self.frame, self.where = frame, N.frame_span(own) or self.where
            if own is not None:  # the library line an error names besides the user's (else as before)
                self.library = frame if frame != own else None
            self.comment(frame)
            ins = [read(a) for a in eqn.invars]
            handler = PRIMS.get(eqn.primitive.name)
            if id(eqn) in self.pool_sums:  # a sum of pads folded into one pool (_pad_sum_pool)
                handler = self.pool_sums[id(eqn)]
            if handler is None:
                self.fail(f"jax primitive '{eqn.primitive.name}' has no spmdlang equivalent")
            outs = handler(self, eqn, ins)
            if not isinstance(outs, list):
                outs = [outs]
            target = N.frame_target(frame) if last_of_line.get(_line(eqn)) == i else None
            for v, r in zip(eqn.outvars, outs, strict=True):
                if type(v).__name__ == "DropVar":
                    continue
                if target and len(eqn.outvars) == 1 and not r.is_literal:
                    scope = N.scope_name(eqn)
                    self.body.hint(r.text, N.sanitize(f"{scope}_{target}".lower() if scope else target))
                env[v] = r
        return [read(a) for a in jaxpr.outvars]

    def comment(self, frame):
        text = N.frame_comment(frame)
        if text:
            self.pending = text

    def closed(self, closed_jaxpr, args: list[Ref]) -> list[Ref]:
        consts = [self.constant(c, None) for c in closed_jaxpr.consts]
        return self.run(closed_jaxpr.jaxpr, consts, args)

    def inline(self, eqn, ins, key: str, skip: int = 0):
        sub = eqn.params[key]
        if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
            return self.closed(sub, ins[skip:])
        return self.run(sub, [], ins[skip:])

    # ------------------------------------------------------------------ helpers

    def out(self, eqn, k: int = 0):
        return eqn.outvars[k].aval

    def put(self, eqn, expr: str, k: int = 0) -> Ref:
        aval = self.out(eqn, k)
        return self.ref(self.emit(expr), aval)

    def binary_text(self, a: Ref, b: Ref, op: str) -> str:
        if a.is_literal and b.is_literal:
            a = Ref(self.value(a), a.dtype, a.shape)
        return f"{a.text} {op} {b.text}"


def _line(eqn):
    f = N.user_frame(eqn)
    return (f.file_name, f.start_line) if f is not None else None


def _line_targets(jaxpr) -> dict:
    """User line -> the index of the equation whose value the line's assignment names: the last
    forward (not transposed) equation of the line whose value another line reads or the jaxpr
    returns."""
    lines = [_line(e) for e in jaxpr.eqns]
    readers: dict = {}
    for e, key in zip(jaxpr.eqns, lines):
        for v in e.invars:
            if not hasattr(v, "val"):
                readers.setdefault(v, set()).add(key)
    for v in jaxpr.outvars:
        if not hasattr(v, "val"):
            readers.setdefault(v, set()).add("return")
    out = {}
    for i, (e, key) in enumerate(zip(jaxpr.eqns, lines)):
        if key is None or len(e.outvars) != 1 or "transpose(" in str(e.source_info.name_stack):
            continue
        if readers.get(e.outvars[0], set()) - {key}:
            out[key] = i
    return out


def _np_dtype(dt: str):
    from ..ir import types as T

    return T.np_dtype(dt)


def _const_hint(dt, shape, v) -> str:
    if shape == ():
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if f == 0:
        return "zeros"
    if f == 1:
        return "ones"
    return None


def _ints(xs) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


# ---------------------------------------------------------------------------------- primitives

PRIMS: dict = {}


def prim(*names):
    def register(fn):
        for n in names:
            PRIMS[n] = fn
        return fn

    return register


_UNARY = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh", "logistic": "sigmoid",
          "sin": "sin", "cos": "cos", "floor": "floor", "ceil": "ceil", "sign": "sign", "abs": "abs",
          "erf": "erf", "erf_inv": "erf_inv",
          "log1p": "log1p", "expm1": "expm1", "square": "square", "stop_gradient": "stop_gradient"}


def _unary(name):
    def write(t: Translator, eqn, ins):
        return t.put(eqn, f"{name}({t.value(ins[0])})")

    return write


for _p, _b in _UNARY.items():
    PRIMS[_p] = _unary(_b)


def _atan(t, x: str) -> str:
    """atan of f32 x (Cephes' atanf, within 2 ulp): |x| reduced to [0, tan(pi/8)] by
    atan(x) = pi/2 + atan(-1/x) above tan(3pi/8) and pi/4 + atan((x - 1)/(x + 1)) above tan(pi/8),
    then an odd polynomial; NaN stays NaN, +-inf gives +-pi/2."""
    a = t.emit(f"abs({x})")
    big, mid = t.emit(f"{a} > 2.4142135"), t.emit(f"{a} > 0.41421357")
    r = t.emit(f"where({big}, -1.0 / {a}, where({mid}, ({a} - 1.0) / ({a} + 1.0), {a}))")
    z = t.emit(f"{r} * {r}")
    poly = t.emit(f"(((0.0805374449538 * {z} - 0.138776856032) * {z} + 0.199777106478) * {z} - 0.333329491539)"
                  f" * {z} * {r} + {r}")
    y = t.emit(f"where({big}, 1.5707964, where({mid}, 0.7853982, 0.0)) + {poly}")
    return f"sign({x}) * {y}"  # (sign keeps -0.0's sign: atan(-0.0) = -0.0)


def _in_f32(fn):
    """A unary float function written for f32: bf16 and f16 computed in f32 and rounded once (as
    XLA computes them on CPU); f64 has no equivalent (the approximation is f32's)."""
    def write(t: Translator, eqn, ins):
        (x,) = ins
        name = eqn.primitive.name
        if x.dtype not in ("f32", "bf16", "f16"):
            t.fail(f"jax primitive '{name}' on {x.dtype} has no spmdlang equivalent (f32, bf16 and f16 have one)")
        v = t.value(x) if x.dtype == "f32" else t.emit(f"cast({t.value(x)}, f32)")
        out = fn(t, v)
        return t.put(eqn, out if x.dtype == "f32" else f"cast({t.emit(out)}, {x.dtype})")

    return write


_LN2 = "0.6931472"
# inverse trigonometric and hyperbolic functions, in f32 from the language's exp, log1p, sqrt and
# _atan, written to keep their accuracy where the textbook forms lose it (near 0, near +-1, and
# for large |x|, where x * x overflows)
_F32_FUNCTIONS = {
    "atan": _atan,
    "asin": lambda t, x: _atan(t, t.emit(f"{x} / sqrt((1.0 - {x}) * (1.0 + {x}))")),
    "acos": lambda t, x: f"2.0 * {t.emit(_atan(t, t.emit(f'sqrt((1.0 - {x}) / (1.0 + {x}))')))}",
    "sinh": lambda t, x: (lambda a: f"where(abs({x}) < 1.0, 0.5 * (expm1({x}) - expm1(-{x})), "
                                    f"sign({x}) * (exp({a} - {_LN2}) - exp(-{a} - {_LN2})))")(t.emit(f"abs({x})")),
    "cosh": lambda t, x: (lambda a: f"exp({a} - {_LN2}) + exp(-{a} - {_LN2})")(t.emit(f"abs({x})")),
    "asinh": lambda t, x: (lambda a: f"sign({x}) * where({a} > 1e18, log({a}) + {_LN2}, "
                                     f"log1p({a} + {a} * {a} / (1.0 + sqrt(1.0 + {a} * {a}))))")(t.emit(f"abs({x})")),
    "acosh": lambda t, x: f"where({x} < 1.0, sqrt({x} - 1.0), where({x} > 1e18, log({x}) + {_LN2}, "
                          f"log1p(({x} - 1.0) + sqrt(({x} - 1.0) * ({x} + 1.0)))))",  # (below 1: NaN)
    "atanh": lambda t, x: (lambda a: f"sign({x}) * 0.5 * log1p(2.0 * {a} / (1.0 - {a}))")(t.emit(f"abs({x})")),
    "cbrt": lambda t, x: f"sign({x}) * abs({x}) ** 0.33333334",
}
for _p, _fn in _F32_FUNCTIONS.items():
    PRIMS[_p] = _in_f32(_fn)


# primitives written as one spmdlang expression of their first operand x (and their params p)
_ONE_LINERS = {
    "neg": lambda x, p: f"-{x}",
    "erfc": lambda x, p: f"1.0 - erf({x})",
    "exp2": lambda x, p: f"2.0 ** {x}",
    "tan": lambda x, p: f"sin({x}) / cos({x})",
    "is_finite": lambda x, p: f"abs({x}) < 1e309",
    "squeeze": lambda x, p: f"squeeze({x}, {_ints(p['dimensions'])})",
    "expand_dims": lambda x, p: f"expand_dims({x}, {_ints(p['dimensions'])})",
    "transpose": lambda x, p: f"transpose({x}, {_ints(p['permutation'])})",
}


def _one_liner(fmt):
    def write(t: Translator, eqn, ins):
        return t.put(eqn, fmt(t.value(ins[0]), eqn.params))

    return write


for _p, _f in _ONE_LINERS.items():
    PRIMS[_p] = _one_liner(_f)


_BINOP = {"add": "+", "add_any": "+", "sub": "-", "mul": "*", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
          "gt": ">", "ge": ">="}


def _binop(op):
    def write(t: Translator, eqn, ins):
        a, b = ins
        if op == "*" and a.dtype == "bool":
            return t.put(eqn, f"logical_and({t.value(a)}, {t.value(b)})")
        return t.put(eqn, t.binary_text(a, b, op))

    return write


for _p, _o in _BINOP.items():
    PRIMS[_p] = _binop(_o)


def _total_order_key(t, r: Ref) -> str:
    """A float's key in IEEE's total order (-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN),
    as an integer: its bits read as a signed integer, the negatives' magnitude bits flipped (16-bit
    floats widened to f32 first, exactly)."""
    v = t.value(r)
    if r.dtype in ("bf16", "f16"):
        v = t.emit(f"cast({v}, f32)")
    wide, top = ("i64", "9223372036854775807") if r.dtype == "f64" else ("i32", "2147483647")
    bits = t.emit(f"bitcast_convert_type({v}, {wide})")
    return t.emit(f"where({bits} < 0, bitwise_xor({bits}, {top}), {bits})")


def _total_compare(op):
    def write(t: Translator, eqn, ins):
        a, b = ins
        if a.dtype not in _FLOATS:  # integers and bools: the usual order is total
            return t.put(eqn, t.binary_text(a, b, op))
        return t.put(eqn, f"{_total_order_key(t, a)} {op} {_total_order_key(t, b)}")

    return write


# lax's comparisons in total order (lt_to, le_to: jnp.searchsorted's, lexsort's)
for _p, _o in (("eq_to", "=="), ("lt_to", "<"), ("le_to", "<=")):
    PRIMS[_p] = _total_compare(_o)


def _call2(fn):
    def write(t: Translator, eqn, ins):
        a, b = ins
        if a.is_literal and b.is_literal:
            a = Ref(t.value(a), a.dtype, a.shape)
        return t.put(eqn, f"{fn}({a.text}, {b.text})")

    return write


for _p, _fn in (("max", "maximum"), ("min", "minimum"), ("pow", "pow"), ("atan2", "atan2")):
    PRIMS[_p] = _call2(_fn)


@prim("div")
def _div(t, eqn, ins):
    a, b = ins
    if a.dtype in _FLOATS:
        return t.put(eqn, t.binary_text(a, b, "/"))
    # lax.div on integers rounds toward zero; the language's `//` floors
    av, bv = t.value(a), t.value(b)
    q = t.emit(f"{av} // {bv}")
    fix = t.emit(f"logical_and({av} % {bv} != 0, ({av} < 0) != ({bv} < 0))")
    if _nonzero(b):
        return t.put(eqn, f"where({fix}, {q} + 1, {q})")
    # by zero XLA gives every bit set (-1; the largest u32), where the language's // gives 0
    ones = literal_text(2**32 - 1 if a.dtype == "u32" else -1, a.dtype)
    return t.put(eqn, f"where({bv} == 0, {ones}, {t.emit(f'where({fix}, {q} + 1, {q})')})")


def _nonzero(r: Ref) -> bool:
    return r.is_literal and r.literal != 0


@prim("rem")
def _rem(t, eqn, ins):
    # lax.rem takes the sign of the dividend (C's fmod); the language's `%` the divisor's (numpy)
    av, bv = t.value(ins[0]), t.value(ins[1])
    m = t.emit(f"{av} % {bv}")
    fix = t.emit(f"logical_and({m} != 0, ({m} < 0) != ({av} < 0))")
    if ins[0].dtype in _FLOATS:  # a zero result takes the dividend's sign too (C's fmod: fmod(-3, 1.5) = -0.0)
        r = t.emit(f"where({fix}, {m} - {bv}, {m})")
        return t.put(eqn, f"where({r} == 0.0, {av} * 0.0, {r})")
    if _nonzero(ins[1]):
        return t.put(eqn, f"where({fix}, {m} - {bv}, {m})")
    # an integer by zero: XLA gives the dividend, where the language's % gives 0
    return t.put(eqn, f"where({bv} == 0, {av}, {t.emit(f'where({fix}, {m} - {bv}, {m})')})")


def _logical(fn, op):
    def write(t: Translator, eqn, ins):
        if any(r.dtype != "bool" for r in ins):  # on integers: bitwise
            if fn is None:
                ones = literal_text(2**32 - 1 if ins[0].dtype == "u32" else -1, ins[0].dtype)
                return t.put(eqn, f"bitwise_xor({t.value(ins[0])}, {ones})")
            a, b = ins
            if a.is_literal and b.is_literal:
                a = Ref(t.value(a), a.dtype, a.shape)
            out = t.put(eqn, f"bitwise_{eqn.primitive.name}({a.text}, {b.text})")
            if eqn.primitive.name == "or" and b.literal == _ONE_BITS and t.origin.get(a.text, ("",))[0] == "shr9":
                t.origin[out.text] = ("float_bits", *t.origin[a.text][1:])
            return out
        if fn is None:
            return t.put(eqn, f"logical_not({t.value(ins[0])})")
        if op:
            return t.put(eqn, t.binary_text(ins[0], ins[1], op))
        return t.put(eqn, f"{fn}({t.value(ins[0])}, {t.value(ins[1])})")

    return write


PRIMS["and"] = _logical("logical_and", None)
PRIMS["or"] = _logical("logical_or", None)
PRIMS["xor"] = _logical("xor", "!=")
PRIMS["not"] = _logical(None, None)


def _shift(fn, signed_ok: bool, unsigned_ok: bool):
    def write(t: Translator, eqn, ins):
        a, b = ins
        if (a.dtype == "u32" and not unsigned_ok) or (a.dtype != "u32" and not signed_ok):
            # the other kind of right shift: through the other 32-bit type, the bits as they are
            # (counts too: a negative count is a huge one, which shifts everything out, as XLA's)
            other = {"i32": "u32", "u32": "i32"}.get(a.dtype)
            if other is None:
                t.fail(f"jax primitive '{eqn.primitive.name}' on {a.dtype} has no spmdlang equivalent "
                       "(right_shift is logical on u32, arithmetic on signed integers; i32 and u32 convert)")
            moved = f"{fn}(cast({t.value(a)}, {other}), cast({t.value(b)}, {other}))"
            return t.put(eqn, f"cast({t.emit(moved)}, {a.dtype})")
        if a.is_literal and b.is_literal:
            a = Ref(t.value(a), a.dtype, a.shape)
        out = t.put(eqn, f"{fn}({a.text}, {b.text})")
        if fn == "right_shift" and b.literal == 9 and t.origin.get(a.text, ("",))[0] == "bits":
            t.origin[out.text] = ("shr9", *t.origin[a.text][1:])
        return out

    return write


_ONE_BITS = 0x3F800000  # 1.0f: OR-ed into 23 random mantissa bits, a float in [1, 2)


@prim("bitcast_convert_type")
def _bitcast(t, eqn, ins):
    """The builtin of the same name (same width). jax.random.uniform's step from bits to floats,
    bitcast((bits >> 9) | 1.0f) in [1, 2), reads as the language's uniform(key) + 1.0, bit for bit
    (uniform is that bitcast minus 1.0, exactly)."""
    origin = t.origin.get(ins[0].text, ("",))
    out = t.out(eqn)
    dt = dtype_name(out.dtype, t.where)
    if origin[0] == "float_bits" and dt == "f32":
        return t.put(eqn, f"uniform({origin[1]}, {type_text(out)}) + 1.0")
    x = ins[0]
    if x.dtype == dt:
        return x
    if _np_dtype(x.dtype).itemsize != _np_dtype(dt).itemsize:
        t.fail(f"jax primitive 'bitcast_convert_type' from {x.dtype} to {dt} (another width) has no spmdlang "
               "equivalent")
    return t.put(eqn, f"bitcast_convert_type({t.value(x)}, {dt})")


PRIMS["shift_left"] = _shift("left_shift", True, True)
PRIMS["shift_right_logical"] = _shift("right_shift", False, True)
PRIMS["shift_right_arithmetic"] = _shift("right_shift", True, False)


@prim("integer_pow")
def _integer_pow(t, eqn, ins):
    x, y = t.value(ins[0]), int(eqn.params["y"])
    if y == 2:
        return t.put(eqn, f"square({x})")
    if y == 1:
        return ins[0]
    if y == 3:
        return t.put(eqn, f"{x} * {x} * {x}")
    if y < 0 and ins[0].dtype in _FLOATS:
        return t.put(eqn, f"1.0 / {x} ** {-y}")
    return t.put(eqn, f"{x} ** {y}")


@prim("select_n")
def _select_n(t, eqn, ins):
    pred, *cases = ins
    p = t.value(pred)
    if len(cases) == 1:
        return cases[0]
    if len(cases) == 2:
        cond = p if pred.dtype == "bool" else f"{p} != 0"
        return t.put(eqn, f"where({cond}, {t.value(cases[1])}, {t.value(cases[0])})")
    acc = t.value(cases[-1])
    for k in range(len(cases) - 2, -1, -1):
        expr = f"where({p} == {k}, {t.value(cases[k])}, {acc})"
        acc = t.emit(expr) if k else None
        if not k:
            return t.put(eqn, expr)
    return None  # pragma: no cover


@prim("clamp")
def _clamp(t, eqn, ins):
    lo, x, hi = ins
    return t.put(eqn, f"clip({t.value(x)}, {lo.text}, {hi.text})")


@prim("convert_element_type")
def _convert(t, eqn, ins):
    dt = dtype_name(eqn.params["new_dtype"], t.where)
    x = ins[0]
    if x.is_literal:
        return t.constant(np.asarray(x.literal, dtype=_np_dtype(x.dtype)).astype(_np_dtype(dt)), None)
    if x.dtype == dt:
        return x
    if dt == "bool":
        return t.put(eqn, f"{t.value(x)} != 0")
    return t.put(eqn, f"cast({t.value(x)}, {dt})")


@prim("copy", "copy_p", "optimization_barrier", "name")  # (name: checkpoint_name's tag for remat policies)
def _copy(t, eqn, ins):
    return list(ins)


@prim("debug_print", "debug_callback")
def _debug_print(t, eqn, ins):
    """jax.debug.print / debug.callback: effects only, no values; the program prints nothing."""
    if eqn.outvars:
        t.fail(f"jax primitive '{eqn.primitive.name}' with results has no spmdlang equivalent")
    return []


@prim("reduce_precision")
def _reduce_precision(t, eqn, ins):
    finfo = np.finfo(_np_dtype(ins[0].dtype)) if ins[0].dtype in _FLOATS else None
    if finfo is not None and eqn.params["exponent_bits"] == finfo.nexp and eqn.params["mantissa_bits"] == finfo.nmant:
        return ins[0]
    t.fail("jax primitive 'reduce_precision' to a narrower format has no spmdlang equivalent")


@prim("iota")
def _iota(t, eqn, ins):
    aval = t.out(eqn)
    out = t.put(eqn, f"iota({type_text(aval, t.where)}, {int(eqn.params['dimension'])})")
    t.iotas[out.text] = int(eqn.params["dimension"])
    return out


@prim("broadcast_in_dim")
def _broadcast_in_dim(t, eqn, ins):
    x = ins[0]
    shape = tuple(int(d) for d in eqn.params["shape"])
    dims = tuple(int(d) for d in eqn.params["broadcast_dimensions"])
    if x.is_literal:
        return t.constant(np.full(shape, x.literal, dtype=_np_dtype(x.dtype)), None)
    text = x.text
    if list(dims) != sorted(dims):
        order = sorted(range(len(dims)), key=lambda i: dims[i])
        text = f"transpose({text}, {_ints(order)})"
        dims = tuple(sorted(dims))
    if not dims:
        return t.put(eqn, f"broadcast_to({text}, {_ints(shape)})")
    new = [d for d in range(len(shape)) if d not in dims]
    if new:
        text = f"expand_dims({text}, {_ints(new)})"
    mid = tuple(1 if d in new else x.shape[dims.index(d)] for d in range(len(shape)))
    if mid != shape:
        text = f"broadcast_to({text}, {_ints(shape)})"
    return t.put(eqn, text)


@prim("reshape")
def _reshape(t, eqn, ins):
    v = t.value(ins[0])
    dims = eqn.params.get("dimensions")
    if dims not in (None, ()) and list(dims) != list(range(len(dims))):  # lax.reshape's transpose first
        v = t.emit(f"transpose({v}, {_ints(dims)})")
    return t.put(eqn, f"reshape({v}, {_ints(t.out(eqn).shape)})")


def _slice_text(x: str, starts, stops, steps) -> str:
    parts = []
    for a, b, s in zip(starts, stops, steps):
        part = f"{a}:{b}" if s == 1 else f"{a}:{b}:{s}"
        parts.append(part)
    return f"{x}[{', '.join(parts)}]"


@prim("slice")
def _slice(t, eqn, ins):
    x = ins[0]
    steps = eqn.params["strides"] or (1,) * len(x.shape)
    return t.put(eqn, _slice_text(t.value(x), eqn.params["start_indices"], eqn.params["limit_indices"], steps))


@prim("split")
def _split(t, eqn, ins):
    x, axis = ins[0], int(eqn.params["axis"])
    outs, start = [], 0
    for k, n in enumerate(eqn.params["sizes"]):
        starts = [start if d == axis else 0 for d in range(len(x.shape))]
        stops = [start + n if d == axis else x.shape[d] for d in range(len(x.shape))]
        outs.append(t.put(eqn, _slice_text(t.value(x), starts, stops, [1] * len(x.shape)), k))
        start += n
    return outs


@prim("rev")
def _rev(t, eqn, ins):
    text = t.value(ins[0])
    for d in eqn.params["dimensions"]:
        n = ins[0].shape[d]
        if n > 1:  # (a dim of 0 or 1 element is its own reverse)
            text = f"take({text}, {n - 1} - iota(i32[{n}], 0), axis={d})"
    return t.put(eqn, text)


@prim("concatenate")
def _concatenate(t, eqn, ins):
    return t.put(eqn, f"concat([{', '.join(t.value(r) for r in ins)}], axis={int(eqn.params['dimension'])})")


@prim("empty", "empty2")
def _empty(t, eqn, ins):
    """An uninitialised array (what a traced lax.cond's gradient holds for the residuals of the
    branch not taken, never read): zeros."""
    aval = eqn.outvars[0].aval
    return t.constant(np.zeros(aval.shape, aval.dtype), None)


@prim("nextafter")
def _nextafter(t, eqn, ins):
    """The float after x1 toward x2 (jax.random.truncated_normal's bounds): x1's bits as an
    integer, one up where that moves away from zero, else one down; from zero the least subnormal
    of x2's side; x2 where they are equal; NaN where either is."""
    x1, x2 = ins
    if x1.dtype != "f32" or x2.dtype != "f32":
        t.fail("jax primitive 'nextafter' on other than f32 has no spmdlang equivalent")
    raw_a, b = t.value(x1), t.value(x2)
    # XLA's CPU reads subnormal operands as zero (denormals-are-zero): so do the steps and tests
    a = t.emit(f"where(abs({raw_a}) < 1.1754944e-38, 0.0 * {raw_a}, {raw_a})")
    b_flat = t.emit(f"where(abs({b}) < 1.1754944e-38, 0.0 * {b}, {b})")
    bits = t.emit(f"bitcast_convert_type({a}, i32)")
    step = t.emit(f"where(({b_flat} > {a}) == ({a} >= 0.0), {bits} + 1, {bits} - 1)")
    tiny = t.emit(f"bitcast_convert_type(where({b_flat} > {a}, 1, -2147483647), f32)")
    moved = t.emit(f"where({a} == 0.0, {tiny}, bitcast_convert_type({step}, f32))")
    same = t.emit(f"where({a} == {b_flat}, {b}, {moved})")
    return t.put(eqn, f"where(logical_or({a} != {a}, {b} != {b}), {a} + {b}, {same})")


@prim("stack")
def _stack(t, eqn, ins):
    """jnp.stack's primitive: each operand given a new dim at `axis`, concatenated along it."""
    axis = int(eqn.params["axis"])
    parts = [t.emit(f"expand_dims({t.value(r)}, {axis})") for r in ins]
    return t.put(eqn, f"concat([{', '.join(parts)}], axis={axis})" if len(parts) > 1 else parts[0])


@prim("unstack")
def _unstack(t, eqn, ins):
    """jnp.unstack's primitive (the transpose of stack, in every gradient through jnp.stack):
    the operand's slices along `axis`, that dim dropped."""
    (x,) = ins
    axis = int(eqn.params["axis"])
    rank, n = len(x.shape), x.shape[axis]
    outs = []
    for k in range(n):
        index = ", ".join(str(k) if d == axis else ":" for d in range(rank))
        outs.append(t.ref(t.emit(f"{t.value(x)}[{index}]"), t.out(eqn, k)))
    return outs


@prim("tile")
def _tile(t, eqn, ins):
    """jnp.tile's primitive: x (dims n_i) repeated reps_i times along each dim, as the broadcast
    of x under a new leading dim of reps_i per dim, merged with it."""
    (x,) = ins
    reps = [int(r) for r in eqn.params["reps"]]
    if len(reps) != len(x.shape):
        t.fail("jax primitive 'tile' with reps of another rank than its operand has no spmdlang equivalent")
    inner, outer = [], []
    for r, n in zip(reps, x.shape):
        inner += [1, n]
        outer += [r, n]
    spread = t.emit(f"broadcast_to({t.emit(f'reshape({t.value(x)}, {_ints(inner)})')}, {_ints(outer)})")
    return t.put(eqn, f"reshape({spread}, {_ints([r * n for r, n in zip(reps, x.shape)])})")


@prim("round")
def _round(t, eqn, ins):
    """lax.round: halves to even (jnp.round's, the language's round), or away from zero (lax's
    default): x's integer part, one further out where the rest is at least a half."""
    x = t.value(ins[0])
    if getattr(eqn.params.get("rounding_method"), "name", str(eqn.params.get("rounding_method"))) \
            in ("TO_NEAREST_EVEN", "1"):
        return t.put(eqn, f"round({x})")
    whole = t.emit(f"sign({x}) * floor(abs({x}))")
    return t.put(eqn, f"where(abs({x} - {whole}) >= 0.5, {whole} + sign({x}), {whole})")


def _pool_fold(pad_eqn, pool_eqn):
    """How a pad with interior padding (zeros) read only by a reduce_window_sum (jax's transpose of
    a sum pool: `lax.pad(ct, 0, [(lo, hi, stride - 1)])`, then a stride-1 window sum) folds into one
    pool: (lhs_dilation, padding) of the pool over the pad's operand, or None (no interior padding,
    a negative lo/hi, a dilated window, another value, or a window that leaves other than two dims
    whole): a pool that partitions by halos as the program's own sum pool gradient does."""
    p = pool_eqn.params
    config = [tuple(int(c) for c in cfg) for cfg in pad_eqn.params["padding_config"]]
    v = pad_eqn.invars[1]
    x_aval = pad_eqn.invars[0].aval
    if type(v).__name__ != "Literal" or np.asarray(v.val).shape != () or float(v.val) != 0.0:
        return None
    if np.dtype(x_aval.dtype).kind != "f" or 0 in x_aval.shape or not any(i for _, _, i in config):
        return None
    if any(d != 1 for d in p.get("base_dilation", ())) or any(d != 1 for d in p.get("window_dilation", ())):
        return None
    if any(lo < 0 or hi < 0 for lo, hi, _ in config):
        return None
    lhs = [i + 1 for _, _, i in config]
    padding = [[lo + int(q[0]), hi + int(q[1])] for (lo, hi, _), q in zip(config, p["padding"])]
    free = [d for d in range(len(lhs)) if p["window_dimensions"][d] == 1 and p["window_strides"][d] == 1
            and padding[d] == [0, 0] and lhs[d] == 1]
    return (lhs, padding) if len(free) == 2 else None


def _pad_pool_folds(jaxpr) -> set[int]:
    """The pad equations of `jaxpr` that _pool_fold writes into their one reader, a reduce_window_sum."""
    uses: dict = {}
    for eqn in jaxpr.eqns:
        for k, a in enumerate(eqn.invars):
            if type(a).__name__ != "Literal":
                uses.setdefault(a, []).append((eqn, k))
    for a in jaxpr.outvars:
        if type(a).__name__ != "Literal":
            uses.setdefault(a, []).append((None, 0))
    folds = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name != "pad":
            continue
        readers = uses.get(eqn.outvars[0], [])
        if len(readers) == 1 and readers[0][0] is not None and readers[0][1] == 0:
            pool = readers[0][0]
            if pool.primitive.name == "reduce_window_sum" and _pool_fold(eqn, pool) is not None:
                folds.add(id(eqn))
    return folds


def _pad_sum_pools(jaxpr) -> dict:
    """add/add_any trees whose leaves are pads of one value, all with the same interior padding
    (zeros, non-negative lo/hi) and lo offsets that fill a grid of w_d consecutive offsets per dim:
    jax's transpose of a sum pool written as strided slices added, sum_o pad(ct, (o, hi_o, s - 1)).
    That sum is one sum pool of ct (window w, stride 1, lhs_dilation s, padding lo = a + w - 1 and
    hi = the pad with lo = a's hi), which partitions by halos as the program's own pool gradient.
    Returns id(eqn) -> writer: the root writes the pool, the pads and inner adds nothing."""
    uses: dict = {}
    producer = {}
    for eqn in jaxpr.eqns:
        for a in eqn.invars:
            if type(a).__name__ != "Literal":
                uses[a] = uses.get(a, 0) + 1
        for v in eqn.outvars:
            producer[v] = eqn
    for a in jaxpr.outvars:
        if type(a).__name__ != "Literal":
            uses[a] = uses.get(a, 0) + 1

    def leaves(eqn, inner):
        out = []
        for a in eqn.invars:
            src = producer.get(a) if type(a).__name__ != "Literal" else None
            if src is None or uses.get(a) != 1:
                return None
            if src.primitive.name in ("add", "add_any"):
                inner.append(src)
                sub = leaves(src, inner)
                if sub is None:
                    return None
                out += sub
            elif src.primitive.name == "pad":
                out.append(src)
            else:
                return None
        return out

    found: dict = {}
    for eqn in reversed(jaxpr.eqns):
        if eqn.primitive.name not in ("add", "add_any") or id(eqn) in found:
            continue
        inner: list = []
        pads = leaves(eqn, inner)
        fold = _pad_sum_fold(pads) if pads else None
        if fold is None:
            continue
        for e in inner + pads:
            found[id(e)] = _deferred
        found[id(eqn)] = _sum_pool_writer(pads[0].invars[0], *fold)
    return found


def _pad_sum_fold(pads):
    """(window, padding, lhs_dilation) of the pool that a sum of these pads is, or None."""
    x = pads[0].invars[0]
    if type(x).__name__ == "Literal" or np.dtype(x.aval.dtype).kind != "f" or 0 in x.aval.shape:
        return None
    configs = [[tuple(int(c) for c in cfg) for cfg in e.params["padding_config"]] for e in pads]
    interior = [i for _, _, i in configs[0]]
    for e, cfg in zip(pads, configs):
        v = e.invars[1]
        if e.invars[0] is not x or type(v).__name__ != "Literal" or float(v.val) != 0.0:
            return None
        if [i for _, _, i in cfg] != interior or any(lo < 0 or hi < 0 for lo, hi, _ in cfg):
            return None
    if not any(interior):
        return None
    rank = len(interior)
    los = [sorted({cfg[d][0] for cfg in configs}) for d in range(rank)]
    window = [len(ls) for ls in los]
    if any(ls != list(range(ls[0], ls[0] + len(ls))) for ls in los):
        return None
    grid = sorted(tuple(ls[0] + k for ls, k in zip(los, idx)) for idx in np.ndindex(*window))
    if sorted(tuple(c[0] for c in cfg) for cfg in configs) != grid:  # each offset once
        return None
    first = [next(cfg[d] for cfg in configs if cfg[d][0] == los[d][0]) for d in range(rank)]
    padding = [[los[d][0] + window[d] - 1, first[d][1]] for d in range(rank)]
    lhs = [i + 1 for i in interior]
    free = [d for d in range(rank) if window[d] == 1 and padding[d] == [0, 0] and lhs[d] == 1]
    return (window, padding, lhs) if len(free) == 2 else None


def _deferred(t, eqn, ins):
    if eqn.primitive.name == "pad":
        t.pad_operands[id(eqn.invars[0])] = ins[0]
    return Ref("\x01folded\x01", dtype_name(t.out(eqn).dtype, t.where), aval_shape(t.out(eqn)))


def _sum_pool_writer(x_var, window, padding, lhs):
    def write(t, eqn, ins):
        x = t.pad_operands[id(x_var)]
        return _write_pool(t, eqn, "sum", x, window, [1] * len(window), padding, lhs)

    return write


@prim("pad")
def _pad(t, eqn, ins):
    x, v = ins
    if id(eqn) in t.fold_pads:  # written by its reader, the sum pool (_pool_fold)
        text = f"\x01pad{len(t.deferred_pads)}\x01"
        t.deferred_pads[text] = (x, eqn)
        return Ref(text, x.dtype, aval_shape(t.out(eqn)))
    if not v.is_literal:
        t.fail("jax primitive 'pad' with a padding value computed at run time has no spmdlang equivalent")
    text = t.value(x)
    shape = list(x.shape)
    config = [tuple(int(c) for c in cfg) for cfg in eqn.params["padding_config"]]
    for d, (_lo, _hi, interior) in enumerate(config):
        if interior:  # spread the elements apart: [n] -> [n, 1+interior] -> [n*(1+interior)] minus the tail
            n = shape[d]
            inner = shape[:d + 1] + [1] + shape[d + 1:]
            widths = [[0, 0]] * len(inner)
            widths[d + 1] = [0, interior]
            spread = t.emit(f"pad(reshape({text}, {_ints(inner)}), {widths}, value={v.text})")
            flat = shape[:d] + [n * (1 + interior)] + shape[d + 1:]
            stops = [n * (1 + interior) - interior if e == d else flat[e] for e in range(len(flat))]
            text = t.emit(_slice_text(f"reshape({spread}, {_ints(flat)})", [0] * len(flat), stops, [1] * len(flat)))
            shape[d] = n * (1 + interior) - interior if n else 0
    widths = [[max(lo, 0), max(hi, 0)] for lo, hi, _ in config]
    if any(w != [0, 0] for w in widths):
        text = f"pad({text}, {widths}, value={v.text})"
        shape = [n + lo + hi for n, (lo, hi) in zip(shape, widths)]
    if any(lo < 0 or hi < 0 for lo, hi, _ in config):
        starts = [-lo if lo < 0 else 0 for lo, _, _ in config]
        stops = [n - (-hi if hi < 0 else 0) for n, (_, hi, _) in zip(shape, config)]
        text = _slice_text(f"{t.emit(text)}", starts, stops, [1] * len(shape))
    return t.put(eqn, text)


# ------------------------------------------------------------------------- reductions and scans

def _reduced(t: Translator, x: Ref, fn: str, axes: list) -> str:
    """`fn` (sum, max, min, prod) of x over `axes`, bools through i32."""
    if x.dtype == "bool":
        return f"{fn}(cast({t.value(x)}, i32), axis={_ints(axes)}) > 0"
    return f"{fn}({t.value(x)}, axis={_ints(axes)})"


def _reduction(fn):
    def write(t: Translator, eqn, ins):
        return t.put(eqn, _reduced(t, ins[0], fn, list(eqn.params["axes"])))

    return write


def _positional_collective(fn):
    """psum / pmax / pmin over vmap's axis (vmap(..., axis_name=) and a collective of that name,
    as BatchNorm(axis_name=) under vmap): in the traced jaxpr its axes are positions, a plain
    reduction over those dims of each operand. Over a mesh axis name it is shard_map's, which
    from_jax refuses where it is called."""
    def write(t: Translator, eqn, ins):
        axes = list(eqn.params["axes"])
        if eqn.params.get("axis_index_groups") is not None or not all(isinstance(a, int) for a in axes):
            t.fail(f"jax primitive '{eqn.primitive.name}' over a named axis has no spmdlang equivalent")
        outs = [t.put(eqn, _reduced(t, x, fn, axes) if axes else t.value(x), k) for k, x in enumerate(ins)]
        return outs if len(outs) > 1 else outs[0]

    return write


PRIMS["psum"] = _positional_collective("sum")
PRIMS["pmax"] = _positional_collective("max")
PRIMS["pmin"] = _positional_collective("min")
PRIMS["reduce_sum"] = _reduction("sum")
PRIMS["reduce_max"] = _reduction("max")
PRIMS["reduce_min"] = _reduction("min")
PRIMS["reduce_prod"] = _reduction("prod")
PRIMS["reduce_or"] = _reduction("max")
PRIMS["reduce_and"] = _reduction("min")


def _arg(fn):
    def write(t: Translator, eqn, ins):
        (axis,) = eqn.params["axes"]
        index = dtype_name(eqn.params["index_dtype"])
        if index not in ("i32", "i64"):
            t.fail(f"jax primitive '{eqn.primitive.name}' with index dtype {eqn.params['index_dtype']}: "
                   "spmdlang's gives i32")
        expr = f"{fn}({t.value(ins[0])}, {int(axis)})"
        return t.put(eqn, expr if index == "i32" else f"cast({t.emit(expr)}, i64)")  # (x64: exact below 2^31)

    return write


PRIMS["argmax"] = _arg("argmax")
PRIMS["argmin"] = _arg("argmin")


def _cumulative(fn):
    def write(t: Translator, eqn, ins):
        axis, rev = int(eqn.params["axis"]), bool(eqn.params["reverse"])
        x = t.value(ins[0])
        tail = ", reverse=true" if rev else ""
        if fn == "cummin":
            return t.put(eqn, f"-cummax(-{x}, {axis}{tail})")
        return t.put(eqn, f"{fn}({x}, {axis}{tail})")

    return write


for _c in ("cumsum", "cumprod", "cummax", "cummin"):
    PRIMS[_c] = _cumulative(_c)


@prim("sort")
def _sort(t, eqn, ins):
    d = int(eqn.params["dimension"])
    if int(eqn.params["num_keys"]) != 1:
        t.fail("jax primitive 'sort' over several keys has no spmdlang equivalent")
    keys = t.value(ins[0])
    if len(ins) == 1:
        return t.put(eqn, f"sort({keys}, axis={d})")
    perm = t.emit(f"argsort({keys}, axis={d})")
    outs = [t.put(eqn, f"sort({keys}, axis={d})")]
    for k, r in enumerate(ins[1:], 1):
        if _is_iota_along(t, r, d):
            outs.append(t.ref(perm, t.out(eqn, k)) if r.dtype == "i32" else t.put(eqn, f"cast({perm}, {r.dtype})", k))
        else:
            outs.append(t.put(eqn, f"take_along_axis({t.value(r)}, {perm}, axis={d})", k))
    return outs


def _is_iota_along(t, r: Ref, d: int) -> bool:
    return t.iotas.get(r.text) == d


@prim("top_k")
def _top_k(t, eqn, ins):
    x = ins[0]
    axis = int(eqn.params.get("axis", len(x.shape) - 1))
    if axis not in (-1, len(x.shape) - 1):
        t.fail("jax primitive 'top_k' along an axis other than the last has no spmdlang equivalent")
    a, b = t.body.new(), t.body.new()
    t.line(f"{t.indent}{a}, {b} = top_k({t.value(x)}, {int(eqn.params['k'])})")
    return [t.ref(a, t.out(eqn, 0)), t.ref(b, t.out(eqn, 1))]


# ------------------------------------------------------------------------------- contractions

@prim("dot_general")
def _dot_general(t, eqn, ins):
    a, b = ins
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    la, lbl = [""] * len(a.shape), [""] * len(b.shape)
    letters = iter(_LETTERS)
    out = []
    for i, j in zip(lb, rb):
        la[i] = lbl[j] = next(letters)
        out.append(la[i])
    for i, j in zip(lc, rc):
        la[i] = lbl[j] = next(letters)
    for i in range(len(a.shape)):
        if not la[i]:
            la[i] = next(letters)
            out.append(la[i])
    for j in range(len(b.shape)):
        if not lbl[j]:
            lbl[j] = next(letters)
            out.append(lbl[j])
    want = dtype_name(eqn.params.get("preferred_element_type") or t.out(eqn).dtype, t.where)
    av, bv = t.value(a), t.value(b)
    if a.dtype != want:
        av = f"cast({av}, {want})"
    if b.dtype != want:
        bv = f"cast({bv}, {want})"
    spec = f"{''.join(la)},{''.join(lbl)}->{''.join(out)}"
    if len(a.shape) == 2 and len(b.shape) == 2 and tuple(lc) == (1,) and tuple(rc) == (0,):
        return t.put(eqn, f"{av} @ {bv}")
    return t.put(eqn, f'einsum("{spec}", {av}, {bv})')


@prim("conv_general_dilated")
def _conv(t, eqn, ins):
    x, w = ins
    p = eqn.params
    batch_groups = int(p.get("batch_group_count", 1))
    dn = p["dimension_numbers"]
    lhs, rhs, outs = tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec)
    nsp = len(lhs) - 2
    xv, wv = t.value(x), t.value(w)
    xperm = [lhs[0], *lhs[2:], lhs[1]]
    if xperm != list(range(len(xperm))):
        xv = f"transpose({xv}, {_ints(xperm)})"
    wperm = [*rhs[2:], rhs[1], rhs[0]]
    if wperm != list(range(len(wperm))):
        wv = f"transpose({wv}, {_ints(wperm)})"
    want = dtype_name(p.get("preferred_element_type") or t.out(eqn).dtype, t.where)
    if x.dtype != want:
        xv = f"cast({xv}, {want})"
    if w.dtype != want:
        wv = f"cast({wv}, {want})"
    padding = [[int(lo), int(hi)] for lo, hi in p["padding"]]
    cuts = [(max(0, -lo), max(0, -hi)) for lo, hi in padding]
    if any(c != (0, 0) and d != 1 for c, d in zip(cuts, p["lhs_dilation"])):
        t.fail("jax primitive 'conv_general_dilated' with negative padding of a dilated input has no "
               "spmdlang equivalent")
    groups = int(p["feature_group_count"])
    if batch_groups != 1 and groups == 1 and all(d == 1 for d in p["lhs_dilation"]):
        expr = _batch_grouped_conv(t, eqn, x, w, xv, wv, lhs, rhs, padding, cuts, batch_groups)
        if expr is not None:
            return _conv_out(t, eqn, expr, outs, nsp)
    if batch_groups != 1:
        # (jax's transpose of a grouped conv for its kernel's gradient) batch group g, the g-th
        # block of N / G images, meets output features group g: the same as a conv with g feature
        # groups over the blocks laid side by side in the channel dim
        n, c, sp = x.shape[lhs[0]], x.shape[lhs[1]], [x.shape[d] for d in lhs[2:]]
        xv = t.emit(f"reshape({xv}, {_ints([batch_groups, n // batch_groups, *sp, c])})")
        xv = t.emit(f"transpose({xv}, {_ints([1, *range(2, nsp + 2), 0, nsp + 2])})")
        xv = f"reshape({xv}, {_ints([n // batch_groups, *sp, batch_groups * c])})"
        groups = batch_groups
    if any(c != (0, 0) for c in cuts):
        # negative padding (jax's kernel gradient of a strided conv whose windows miss the last
        # rows) cuts the input: a slice of each such spatial dim, then no padding there
        sp = [x.shape[d] for d in lhs[2:]]
        index = ", ".join([":"] + [f"{lo}:{n - hi}" for (lo, hi), n in zip(cuts, sp)] + [":"])
        xv = f"{t.emit(xv)}[{index}]"
        padding = [[max(0, lo), max(0, hi)] for lo, hi in padding]
    args = [xv, wv, f"stride={_ints(p['window_strides'])}", f"padding={padding}"]
    if any(d != 1 for d in p["lhs_dilation"]):
        args.append(f"lhs_dilation={_ints(p['lhs_dilation'])}")
    if any(d != 1 for d in p["rhs_dilation"]):
        args.append(f"rhs_dilation={_ints(p['rhs_dilation'])}")
    if groups != 1:
        args.append(f"groups={groups}")
    return _conv_out(t, eqn, f"conv({', '.join(args)})", outs, nsp)


def _conv_out(t, eqn, expr: str, outs, nsp: int):
    """A conv's result in ours, [N, spatial..., F], put where jax's out_spec has N, F and each spatial dim."""
    ours = {outs[0]: 0, outs[1]: nsp + 1, **{outs[2 + i]: 1 + i for i in range(nsp)}}
    perm = [ours[d] for d in range(nsp + 2)]
    if perm != list(range(nsp + 2)):
        expr = f"transpose({t.emit(expr)}, {_ints(perm)})"
    return t.put(eqn, expr)


_MAX_GROUPED_POSITIONS = 64


def _batch_grouped_conv(t, eqn, x, w, xv, wv, lhs, rhs, padding, cuts, groups: int) -> str | None:
    """jax's kernel gradient of a grouped or depthwise conv: a conv with batch_group_count G whose
    output positions are the kernel's taps. Each position is one contraction over its window of
    the input (the images' rows and columns, and the batch, which jax puts in the features): a
    slice, reshaped so that batch group g meets output feature group g, and an einsum; the
    positions then stack. The batch stays split (each einsum a partial sum) where the other form
    (the batch groups laid side by side in the channels) must gather it. None where the output
    has more than _MAX_GROUPED_POSITIONS positions: that form is written instead."""
    p = eqn.params
    nsp = len(lhs) - 2
    b, c_in = x.shape[lhs[0]], x.shape[lhs[1]]
    size = [x.shape[d] - lo - hi for d, (lo, hi) in zip(lhs[2:], cuts)]
    k = [w.shape[d] for d in rhs[2:]]
    f = w.shape[rhs[0]]
    strides, dil = [int(v) for v in p["window_strides"]], [int(v) for v in p["rhs_dilation"]]
    pad = [[max(0, lo), max(0, hi)] for lo, hi in padding]
    span = [(kk - 1) * d + 1 for kk, d in zip(k, dil)]
    out = [(n + lo + hi - sp) // s + 1 for n, (lo, hi), sp, s in zip(size, pad, span, strides)]
    positions = int(np.prod(out))
    if positions > _MAX_GROUPED_POSITIONS or b % groups or f % groups or min(out) < 1:
        return None
    if any(cut != (0, 0) for cut in cuts):
        kept = [f"{lo}:{x.shape[d] - hi}" for (lo, hi), d in zip(cuts, lhs[2:])]
        xv = f"{t.emit(xv)}[{', '.join([':', *kept, ':'])}]"
    if any(q != [0, 0] for q in pad):
        xv = f"pad({t.emit(xv)}, {[[0, 0], *pad, [0, 0]]})"
    xv = t.emit(xv)
    letters = "".join(chr(ord("h") + i) for i in range(nsp))  # h, i, j: the window's dims
    kernel = t.emit(f"reshape({wv}, {_ints([*k, c_in, groups, f // groups])})")
    parts = []
    for flat in range(positions):
        o = np.unravel_index(flat, out)
        index = ", ".join([":"] + [f"{oi * s}:{oi * s + sp}:{d}" if d != 1 else f"{oi * s}:{oi * s + sp}"
                                   for oi, s, sp, d in zip(o, strides, span, dil)] + [":"])
        win = t.emit(f"reshape({xv}[{index}], {_ints([groups, b // groups, *k, c_in])})")
        r = t.emit(f'einsum("gb{letters}c,{letters}cgf->bgf", {win}, {kernel})')
        parts.append(t.emit(f"expand_dims(reshape({r}, {_ints([b // groups, f])}), 1)"))
    stacked = t.emit(f"concat([{', '.join(parts)}], axis=1)") if len(parts) > 1 else parts[0]
    return f"reshape({stacked}, {_ints([b // groups, *out, f])})"


def _pool(kind):
    def write(t: Translator, eqn, ins):
        x = ins[0]
        p = eqn.params
        window, strides = list(p["window_dimensions"]), list(p["window_strides"])
        padding = [list(map(int, q)) for q in p["padding"]]
        lhs = [1] * len(window)
        if x.text in t.deferred_pads:  # a pad with interior padding folded in: one dilated sum pool
            x, pad_eqn = t.deferred_pads[x.text]
            lhs, padding = _pool_fold(pad_eqn, eqn)
        if any(d != 1 for d in p.get("base_dilation", ())) or any(d != 1 for d in p.get("window_dilation", ())):
            t.fail(f"jax primitive '{eqn.primitive.name}' with dilation has no spmdlang equivalent")
        return _write_pool(t, eqn, kind, x, window, strides, padding, lhs)

    return write


def _write_pool(t, eqn, kind, x, window, strides, padding, lhs):
    """A max/min/sum pool over the dims of x with a window (a jax reduce_window) as the pool builtins
    write it: over [N, spatial..., C], the two whole dims moved first and last."""
    rank = len(x.shape)
    free = [d for d in range(rank) if window[d] == 1 and strides[d] == 1 and padding[d] == [0, 0]
            and lhs[d] == 1]
    if len(free) == rank:
        return x
    # the pool builtins work over [N, spatial..., C]: two free dims, moved first and last
    free, spatial = _pool_dims(t, eqn, rank, free)
    perm = [free[0], *spatial, free[1]]
    win, st, pad = [window[d] for d in spatial], [strides[d] for d in spatial], [padding[d] for d in spatial]
    dil = [lhs[d] for d in spatial]
    v = t.value(x)
    if perm != list(range(rank)):
        v = t.emit(f"transpose({v}, {_ints(perm)})")
    if kind == "max":
        expr = f"max_pool({v}, {_ints(win)}, stride={_ints(st)}, padding={pad})"
    elif kind == "min":
        expr = f"-max_pool(-{v}, {_ints(win)}, stride={_ints(st)}, padding={pad})"
    else:
        if x.dtype not in _FLOATS:
            t.fail(f"jax primitive '{eqn.primitive.name}' summing integers has no spmdlang equivalent")
        extra = f", lhs_dilation={_ints(dil)}" if any(d != 1 for d in dil) else ""
        expr = f"avg_pool({v}, {_ints(win)}, stride={_ints(st)}, padding={pad}{extra}) * {int(np.prod(win))}.0"
    if perm != list(range(rank)):
        expr = f"transpose({t.emit(expr)}, {_ints([perm.index(d) for d in range(rank)])})"
    return t.put(eqn, expr)


for _kind in ("sum", "max", "min"):
    PRIMS[f"reduce_window_{_kind}"] = _pool(_kind)


def _pool_dims(t, eqn, rank: int, whole: list[int]) -> tuple[list[int], list[int]]:
    """The pool's [N, C] dims and its spatial dims, of the dims its window leaves `whole`: those two,
    or where more are whole (flax's nn.max_pool(x, (3, 1)) on NHWC) the first and the last, the
    others spatial dims of a window of 1."""
    if len(whole) > 2 and 0 in whole and rank - 1 in whole:
        whole = [0, rank - 1]
    if len(whole) != 2:
        t.fail(f"jax primitive '{eqn.primitive.name}' over a window that leaves {len(whole)} dims whole (of "
               f"{rank}) has no spmdlang equivalent (pools work over the spatial dims of [N, spatial..., C]: "
               "two dims whole)")
    return whole, [d for d in range(rank) if d not in whole]


@prim("reduce_window")
def _reduce_window(t, eqn, ins):
    body = eqn.params["jaxpr"]
    jaxpr = body.jaxpr if hasattr(body, "jaxpr") else body
    prims = [e.primitive.name for e in jaxpr.eqns]
    if len(ins) != 2 or prims not in (["add"], ["max"], ["min"]):
        t.fail("jax primitive 'reduce_window' with a body other than one add or max has no spmdlang equivalent")
    init = ins[1]
    kind = {"add": "sum", "max": "max", "min": "min"}[prims[0]]
    neutral = {"sum": 0.0, "max": -np.inf, "min": np.inf}[kind]
    if not init.is_literal or float(init.literal) != neutral:
        t.fail("jax primitive 'reduce_window' with an initial value other than its reduction's identity "
               "has no spmdlang equivalent")
    return _pool(kind)(t, eqn, ins)


@prim("select_and_scatter_add")
def _select_and_scatter_add(t, eqn, ins):
    """A max (min) pool's gradient: max_pool_grad over [N, spatial..., C] (of -x for a min pool)."""
    src, x = ins
    p = eqn.params
    chooser = str(p["select_prim"])
    if chooser not in ("ge", "le"):
        t.fail(f"jax primitive 'select_and_scatter_add' selecting by '{chooser}' has no spmdlang equivalent")
    window, strides = list(p["window_dimensions"]), list(p["window_strides"])
    padding = [list(map(int, q)) for q in p["padding"]]
    rank = len(x.shape)
    free = [d for d in range(rank) if window[d] == 1 and strides[d] == 1 and padding[d] == [0, 0]]
    free, spatial = _pool_dims(t, eqn, rank, free)
    perm = [free[0], *spatial, free[1]]
    win, st, pad = [window[d] for d in spatial], [strides[d] for d in spatial], [padding[d] for d in spatial]
    xv, sv = t.value(x), t.value(src)
    if perm != list(range(rank)):
        xv, sv = t.emit(f"transpose({xv}, {_ints(perm)})"), t.emit(f"transpose({sv}, {_ints(perm)})")
    if chooser == "le":
        xv = f"-{xv}"
    expr = f"max_pool_grad({xv}, {sv}, {_ints(win)}, stride={_ints(st)}, padding={pad})"
    if perm != list(range(rank)):
        expr = f"transpose({t.emit(expr)}, {_ints([perm.index(d) for d in range(rank)])})"
    return t.put(eqn, expr)


# ----------------------------------------------------------------------------- dynamic indexing

@prim("dynamic_slice")
def _dynamic_slice(t, eqn, ins):
    x, *starts = ins
    return t.put(eqn, f"dynamic_slice({t.value(x)}, [{', '.join(s.text for s in starts)}], "
                      f"{_ints(eqn.params['slice_sizes'])})")


@prim("dynamic_update_slice")
def _dynamic_update_slice(t, eqn, ins):
    x, u, *starts = ins
    return t.put(eqn, f"dynamic_update_slice({t.value(x)}, {t.value(u)}, [{', '.join(s.text for s in starts)}])")


@prim("gather")
def _gather(t, eqn, ins):
    x, ids = ins
    dn = eqn.params["dimension_numbers"]
    sizes = list(eqn.params["slice_sizes"])
    rank = len(x.shape)
    idx_batch = tuple(getattr(dn, "start_indices_batching_dims", ()))
    op_batch = tuple(getattr(dn, "operand_batching_dims", ()))
    if len(dn.start_index_map) > 1 and not op_batch:
        return t.put(eqn, _point_gather(t, eqn, x, ids, dn, sizes))
    if op_batch and not _along_axis_form(dn, sizes, ids, rank):
        return t.put(eqn, _point_gather(t, eqn, x, ids, dn, sizes))
    if len(dn.start_index_map) == 1 and not tuple(dn.collapsed_slice_dims) and ids.shape[-1] == 1:
        # one element kept as a dim of size 1 (jnp.searchsorted's `take(a, i)[:, None]`)
        return t.put(eqn, _point_gather(t, eqn, x, ids, dn, sizes))
    if len(dn.start_index_map) != 1 or tuple(dn.collapsed_slice_dims) != tuple(dn.start_index_map) \
            or ids.shape[-1] != 1:
        t.fail("jax primitive 'gather' in a form other than take / take_along_axis has no spmdlang equivalent")
    axis = int(dn.start_index_map[0])
    ids_text = f"reshape({t.value(ids)}, {_ints(ids.shape[:-1])})"
    if not op_batch:  # take: every other dim whole
        if any(sizes[d] != (1 if d == axis else x.shape[d]) for d in range(rank)):
            t.fail("jax primitive 'gather' of partial slices has no spmdlang equivalent")
        nb = len(ids.shape) - 1
        # ours: x.shape[:axis] + ids.shape[:-1] + x.shape[axis+1:]; jax puts the offset dims at offset_dims
        ours = [("o", d) for d in range(axis)] + [("b", i) for i in range(nb)] + \
               [("o", d) for d in range(axis + 1, rank)]
        offsets = [d for d in range(rank) if d != axis]
        jax_order = _jax_order(len(ours), dn.offset_dims, offsets, "o")
        expr = f"take({t.value(x)}, {ids_text}, axis={axis})"
        if _fills(eqn):  # out-of-range ids read the fill value, not a clamped row
            expr = _filled(t, eqn, x, ids, axis, expr, [1] * axis + list(ids.shape[:-1]) + [1] * (rank - axis - 1))
        perm = [ours.index(k) for k in jax_order]
        if perm != list(range(len(perm))):
            expr = f"transpose({t.emit(expr)}, {_ints(perm)})"
        return t.put(eqn, expr)
    others = [d for d in range(rank) if d != axis]
    if list(op_batch) != others or list(idx_batch) != others or tuple(dn.offset_dims) \
            or any(s != 1 for s in sizes) or len(ids.shape) != rank + 1:
        t.fail("jax primitive 'gather' in a form other than take / take_along_axis has no spmdlang equivalent")
    expr = f"take_along_axis({t.value(x)}, {ids_text}, axis={axis})"
    if _fills(eqn):
        expr = _filled(t, eqn, x, ids, axis, expr, list(ids.shape[:-1]))
    return t.put(eqn, expr)


def _batch_counters(t, ids, idx_batch: list[int], ids_text: str | None = None) -> str | None:
    """The ids of a vmapped gather or scatter with its batch made explicit: batch b of the ids
    reaches batch b of x, an index along each operand batching dim (an iota along the ids' batch
    dim) put before the ids' own. None without batching dims."""
    if not idx_batch:
        return None
    shape = ", ".join(map(str, list(ids.shape[:-1]) + [1]))
    counters = [t.emit(f"iota({ids.dtype}[{shape}], {ib})") for ib in idx_batch]
    return t.emit(f"concat([{', '.join(counters)}, {ids_text or t.value(ids)}], axis={len(ids.shape) - 1})")


def _along_axis_scatter_form(dn, ids, rank: int) -> bool:
    """The transpose of take_along_axis: one scattered dim, every other dim a batching dim."""
    if len(dn.scatter_dims_to_operand_dims) != 1 or \
            tuple(dn.inserted_window_dims) != tuple(dn.scatter_dims_to_operand_dims):
        return False
    others = [d for d in range(rank) if d != int(dn.scatter_dims_to_operand_dims[0])]
    return list(dn.operand_batching_dims) == others and list(dn.scatter_indices_batching_dims) == others \
        and not tuple(dn.update_window_dims) and len(ids.shape) == rank + 1 and ids.shape[-1] == 1


def _along_axis_form(dn, sizes, ids, rank: int) -> bool:
    """take_along_axis's gather: one indexed dim, every other dim a batching dim of ids too."""
    if len(dn.start_index_map) != 1 or tuple(dn.collapsed_slice_dims) != tuple(dn.start_index_map):
        return False
    others = [d for d in range(rank) if d != int(dn.start_index_map[0])]
    return list(dn.operand_batching_dims) == others and list(dn.start_indices_batching_dims) == others \
        and not tuple(dn.offset_dims) and all(s == 1 for s in sizes) and len(ids.shape) == rank + 1 \
        and ids.shape[-1] == 1


def _point_gather(t, eqn, x, ids, dn, sizes) -> str:
    """A gather of single elements along several dims, the others whole: numpy's x[i, j] with
    index arrays (`logp[jnp.arange(n), labels]`, x[r[:, None], c[None, :]]). The indexed dims
    are moved to the front and merged into one, and each point's row-major position among them
    is taken (each id clamped into its dim, as XLA clamps; in FILL_OR_DROP mode a point with an
    id out of range reads the fill value). An indexed dim read whole (jnp's `a[:, j]` under
    vmap indexes the `:` too) has only the start 0 once clamped: its id is dropped; one read at
    size 1 without being collapsed is a point whose dim stays in the result, of size 1."""
    rank, indexed_all = len(x.shape), [int(d) for d in dn.start_index_map]
    collapsed = {int(d) for d in dn.collapsed_slice_dims}
    op_batch = [int(d) for d in getattr(dn, "operand_batching_dims", ())]
    idx_batch = [int(d) for d in getattr(dn, "start_indices_batching_dims", ())]
    whole = {d for d in indexed_all if d not in collapsed and sizes[d] == x.shape[d] and not _fills(eqn)}
    cols = [j for j, d in enumerate(indexed_all) if d not in whole]
    indexed = [indexed_all[j] for j in cols]
    dims, nb = op_batch + indexed, len(ids.shape) - 1
    if not collapsed <= set(indexed) or ids.shape[-1] != len(indexed_all) or not indexed \
            or any(sizes[d] != (1 if d in dims else x.shape[d]) for d in range(rank)):
        t.fail("jax primitive 'gather' in a form other than take / take_along_axis / indexing by arrays of ids "
               "has no spmdlang equivalent")
    ids_text = _id_columns(t, ids, cols) if len(cols) != len(indexed_all) else None
    others = [d for d in range(rank) if d not in dims]
    flat, linear = _flat_points(t, eqn, x, ids, dims, clamp=not _fills(eqn),
                                ids_text=_batch_counters(t, ids, idx_batch, ids_text) or ids_text)
    expr = f"take({flat}, {linear}, axis=0)"
    if _fills(eqn):  # a point with an id out of range (position -1) reads the fill value
        inside = t.emit(f"{linear} >= 0")
        if others:
            inside = t.emit(f"reshape({inside}, {_ints(list(ids.shape[:-1]) + [1] * len(others))})")
        expr = f"where({inside}, {t.emit(expr)}, {_fill_value(t, eqn, x)})"
    offsets = [d for d in range(rank) if d not in collapsed and d not in op_batch]  # jax's result dims
    if offsets != others:  # points kept as dims of size 1
        kept = list(ids.shape[:-1]) + [1 if d in indexed else x.shape[d] for d in offsets]
        expr = f"reshape({t.emit(expr)}, {_ints(kept)})"
    ours = [("b", i) for i in range(nb)] + [("o", d) for d in offsets]
    jax_order = _jax_order(len(ours), dn.offset_dims, offsets, "o")
    perm = [ours.index(q) for q in jax_order]
    if perm != list(range(len(perm))):
        expr = f"transpose({t.emit(expr)}, {_ints(perm)})"
    return expr


def _id_columns(t, ids, cols: list[int]) -> str:
    """The ids (batch + [k]) with only the index columns `cols` kept, in that order."""
    lead, nb = "".join(":, " for _ in range(len(ids.shape) - 1)), len(ids.shape) - 1
    return t.emit(f"concat([{', '.join(f'{t.value(ids)}[{lead}{j}:{j + 1}]' for j in cols)}], axis={nb})")


def _flat_points(t, eqn, x, ids, dims: list[int], clamp: bool, ids_text: str | None = None) -> tuple[str, str]:
    """x with `dims` moved to the front and merged into one, and each point's row-major position
    in them (ids of shape batch + [len(dims)]). Each id is clamped into its dim (`clamp`), or a
    point with an id out of range gets position -1 (out of range of the merged dim too)."""
    rank, k, nb = len(x.shape), len(dims), len(ids.shape) - 1
    others = [d for d in range(rank) if d not in dims]
    xv = t.value(x)
    if dims + others != list(range(rank)):
        xv = t.emit(f"transpose({xv}, {_ints(dims + others)})")
    count = int(np.prod([x.shape[d] for d in dims]))
    flat = t.emit(f"reshape({xv}, {_ints([count] + [x.shape[d] for d in others])})")
    idv = ids_text or t.value(ids)
    linear, inside, stride = None, None, 1
    for j in reversed(range(k)):
        n = x.shape[dims[j]]
        i = t.emit(f"{idv}[{', '.join([':'] * nb + [str(j)])}]")
        if not clamp:
            ok = t.emit(f"logical_and({i} >= 0, {i} <= {n - 1})")
            inside = ok if inside is None else t.emit(f"logical_and({inside}, {ok})")
        term = t.emit(f"clip({i}, 0, {n - 1})")
        if stride != 1:
            term = t.emit(f"{term} * {stride}")
        linear = term if linear is None else t.emit(f"{linear} + {term}")
        stride *= n
    if inside is not None:
        linear = t.emit(f"where({inside}, {linear}, -1)")
    return flat, linear


def _point_scatter_add(t, eqn, x, ids, upd, dn, builtin: str = "scatter_add") -> str:
    """The transpose of _point_gather (its gradient; `.at[i, j].add(u)` with index arrays):
    scatter_add into x's indexed dims merged into one, at each point's position there. An id out
    of range drops its point (FILL_OR_DROP, PROMISE_IN_BOUNDS: XLA's scatter), or is clamped (CLIP).
    As in _point_gather, an indexed dim written whole (with CLIP: its start is 0) drops its id, and
    a point dim the updates keep at size 1 is reshaped away."""
    rank, indexed_all = len(x.shape), [int(d) for d in dn.scatter_dims_to_operand_dims]
    inserted = {int(d) for d in dn.inserted_window_dims}
    op_batch = [int(d) for d in getattr(dn, "operand_batching_dims", ())]
    idx_batch = [int(d) for d in getattr(dn, "scatter_indices_batching_dims", ())]
    windows = [d for d in range(rank) if d not in inserted and d not in op_batch]  # the updates' window dims
    size = dict(zip(windows, (upd.shape[q] for q in dn.update_window_dims))) \
        if len(dn.update_window_dims) == len(windows) else None
    clip = "CLIP" in _mode(eqn)
    whole = {d for d in indexed_all if size and d not in inserted and clip and size[d] == x.shape[d]}
    cols = [j for j, d in enumerate(indexed_all) if d not in whole]
    indexed = [indexed_all[j] for j in cols]
    dims, nb = op_batch + indexed, len(ids.shape) - 1
    others = [d for d in range(rank) if d not in dims]
    if size is None or not inserted <= set(indexed) or ids.shape[-1] != len(indexed_all) or not indexed \
            or any(size[d] != (1 if d in indexed else x.shape[d]) for d in windows):
        t.fail(f"jax primitive '{eqn.primitive.name}' in a form other than scatter_add / the transpose of "
               "take_along_axis / indexing by arrays of ids has no spmdlang equivalent")
    ids_text = _id_columns(t, ids, cols) if len(cols) != len(indexed_all) else None
    flat, linear = _flat_points(t, eqn, x, ids, dims, clamp=clip,
                                ids_text=_batch_counters(t, ids, idx_batch, ids_text) or ids_text)
    ours = [("b", i) for i in range(nb)] + [("w", d) for d in windows]
    jax_order = _jax_order(len(upd.shape), dn.update_window_dims, windows, "w")
    perm = [jax_order.index(q) for q in ours]
    u = t.value(upd)
    if perm != list(range(len(perm))):
        u = t.emit(f"transpose({u}, {_ints(perm)})")
    if windows != others:  # the point dims the updates keep at size 1
        u = t.emit(f"reshape({u}, {_ints(list(ids.shape[:-1]) + [x.shape[d] for d in others])})")
    added = t.emit(f"{builtin}({flat}, {linear}, {u}, axis=0)")
    moved = dims + others
    out = f"reshape({added}, {_ints([x.shape[d] for d in moved])})"
    back = [moved.index(d) for d in range(rank)]
    if back != list(range(rank)):
        out = f"transpose({t.emit(out)}, {_ints(back)})"
    return out


_SCATTER_COMBINE = {"scatter": None, "scatter-mul": "{0} * {1}", "scatter_mul": "{0} * {1}",
                    "scatter-min": "minimum({0}, {1})", "scatter_min": "minimum({0}, {1})",
                    "scatter-max": "maximum({0}, {1})", "scatter_max": "maximum({0}, {1})"}


@prim(*_SCATTER_COMBINE)
def _scatter(t, eqn, ins):
    x, ids, upd = ins
    dn = eqn.params["dimension_numbers"]
    if len(ids.shape) != 1 or tuple(getattr(dn, "operand_batching_dims", ())):
        value = _static(t, upd)
        if value is not None and eqn.primitive.name in ("scatter", "scatter-min", "scatter_min",
                                                        "scatter-max", "scatter_max"):
            return t.put(eqn, _uniform_scatter(t, eqn, x, ids, upd, dn, value))
        if eqn.params.get("unique_indices"):
            return t.put(eqn, _unique_scatter(t, eqn, x, ids, upd, dn, _SCATTER_COMBINE[eqn.primitive.name]))
        if eqn.primitive.name in ("scatter-max", "scatter_max", "scatter-min", "scatter_min"):  # segment_max
            kind = "scatter_max" if "max" in eqn.primitive.name else "scatter_min"
            if x.dtype != "bool":
                return t.put(eqn, _point_scatter_add(t, eqn, x, ids, upd, dn, kind))
            xi = Ref(t.emit(f"cast({t.value(x)}, i32)"), "i32", tuple(x.shape))  # (or / and: as 0 and 1)
            ui = Ref(t.emit(f"cast({t.value(upd)}, i32)"), "i32", tuple(upd.shape))
            return t.put(eqn, f"{t.emit(_point_scatter_add(t, eqn, xi, ids, ui, dn, kind))} != 0")
        if "mul" in eqn.primitive.name:  # (x.at[ids].mul, jax.ops.segment_prod)
            t.fail(f"jax primitive '{eqn.primitive.name}' at arrays of ids has no spmdlang equivalent: the "
                   "language's scatters add, take the maximum or the minimum (a product at ids you know to be "
                   "distinct imports: x.at[ids].mul(u, unique_indices=True))")
        t.fail(f"jax primitive '{eqn.primitive.name}' at arrays of ids has no spmdlang equivalent: with "
               "duplicate ids its result depends on the order they are applied in (one index per dim: "
               "x.at[i, :, j].set(u) with integer i, j; with arrays of ids, .at[...].add/.min/.max, .set "
               "of one value: x.at[ids].set(0.0), or ids you know to be distinct: "
               "x.at[ids].set(u, unique_indices=True))")
    return t.put(eqn, _window_scatter(t, eqn, x, ids, upd, dn, _SCATTER_COMBINE[eqn.primitive.name]))


def _uniform_scatter(t, eqn, x, ids, upd, dn, value) -> str:
    """`x.at[ids].set(v)` (or .min / .max) with arrays of ids and one value v for every update
    (masking rows, a one-hot): the same whatever order duplicate ids are applied in. Where any
    update lands (a scatter-add of ones into zeros, as _point_scatter_add places them), v or
    minimum/maximum(x, v); elsewhere x."""
    v = literal_text(value, x.dtype)
    new = {"scatter": f"cast({v}, {x.dtype})"}.get(eqn.primitive.name) or \
        f"{'minimum' if 'min' in eqn.primitive.name else 'maximum'}({t.value(x)}, {v})"
    return f"where({_landed(t, eqn, x, ids, upd, dn)}, {new}, {t.value(x)})"


def _landed(t, eqn, x, ids, upd, dn) -> str:
    """Where any update of a scatter at arrays of ids lands: a scatter-add of ones into zeros,
    placed as _point_scatter_add places them, above zero."""
    zeros = t.constant(np.zeros(x.shape, np.float32), None, materialize=True)
    ones = t.constant(np.ones(upd.shape, np.float32), None, materialize=True)
    return t.emit(f"{t.emit(_point_scatter_add(t, eqn, zeros, ids, ones, dn))} > 0.0")


def _unique_scatter(t, eqn, x, ids, upd, dn, combine: str | None) -> str:
    """A scatter at arrays of ids that jax promises distinct (`x.at[ids].set(u,
    unique_indices=True)`; a vmapped dynamic_update_slice, whose batching rule promises it): no
    two updates land on one element, so the order they would be applied in does not matter. The
    updates are scatter-added (as _point_scatter_add places them) into -0.0, addition's identity
    (each lands as it is; where the updates are split, a -0.0 may come back +0.0 from the shards'
    sum, as in any sum over shards); where an update lands (a scatter-add of ones) that value, or
    x combined with it (mul, min, max); elsewhere x."""
    dt = _np_dtype(x.dtype)
    as_int = dt.kind == "b"  # (bools scatter as i32)
    u, base = t.value(upd), np.full(x.shape, 0 if dt.kind in "biu" else -0.0, np.int32 if as_int else dt)
    if as_int:
        u = Ref(t.emit(f"cast({u}, i32)"), "i32", tuple(upd.shape))
    placed = t.emit(_point_scatter_add(t, eqn, t.constant(base, None, materialize=True), ids,
                                       u if as_int else upd, dn))
    if as_int:
        placed = t.emit(f"{placed} != 0")
    new = placed if combine is None else t.emit(combine.format(t.value(x), placed))
    return f"where({_landed(t, eqn, x, ids, upd, dn)}, {new}, {t.value(x)})"


def _window_scatter(t, eqn, x, ids, upd, dn, combine: str | None) -> str:
    """A scatter of one window at one index per scattered dim (`x.at[i].set(u)`,
    `cache.at[:, pos].set(kv)`, `x.at[i, 2:4].max(u)`): dynamic_update_slice of the window (set),
    or of the window read with dynamic_slice combined with the update (add, mul, min, max). XLA
    drops a window that does not fit (FILL_OR_DROP, PROMISE_IN_BOUNDS) and clamps its start
    (CLIP), as dynamic_update_slice does."""
    rank = len(x.shape)
    window_dims = [d for d in range(rank) if d not in set(dn.inserted_window_dims)]
    if tuple(dn.update_window_dims) != tuple(range(len(upd.shape))) or len(window_dims) != len(upd.shape):
        t.fail(f"jax primitive '{eqn.primitive.name}' in this form has no spmdlang equivalent")
    sizes = [1] * rank
    for p, d in zip(dn.update_window_dims, window_dims):
        sizes[d] = upd.shape[p]
    xv, idv = t.value(x), t.value(ids)
    starts, inside = ["0"] * rank, None
    for j, d in enumerate(dn.scatter_dims_to_operand_dims):
        i = t.emit(f"{idv}[{j}]")
        starts[d] = i
        if "CLIP" not in _mode(eqn):
            ok = t.emit(f"logical_and({i} >= 0, {i} <= {x.shape[d] - sizes[d]})")
            inside = ok if inside is None else t.emit(f"logical_and({inside}, {ok})")
    u = t.value(upd)
    if list(upd.shape) != sizes:
        u = t.emit(f"reshape({u}, {_ints(sizes)})")
    where = "[" + ", ".join(starts) + "]"
    if combine is not None:
        u = t.emit(combine.format(t.emit(f"dynamic_slice({xv}, {where}, {_ints(sizes)})"), u))
    new = f"dynamic_update_slice({xv}, {u}, {where})"
    return new if inside is None else f"where({inside}, {t.emit(new)}, {xv})"


def _mode(eqn) -> str:
    mode = eqn.params.get("mode")
    return getattr(mode, "name", str(mode or "")).upper()


def _fills(eqn) -> bool:
    """A gather in jax's FILL_OR_DROP mode (jnp.take's default): an id outside [0, n-1] reads the
    fill value. CLIP and PROMISE_IN_BOUNDS clamp, as XLA and the language's take do."""
    return "FILL" in _mode(eqn)


def _in_range(t, ids, n: int) -> str:
    i = t.emit(f"reshape({t.value(ids)}, {_ints(ids.shape[:-1])})")
    return t.emit(f"logical_and({i} >= 0, {i} <= {n - 1})")


def _filled(t, eqn, x, ids, axis: int, expr: str, mask_shape: list[int]) -> str:
    """`expr` (a take of clamped ids) where the ids are in range, jax's fill value elsewhere: the
    gather's fill_value, else NaN for floats, the least signed or the largest unsigned integer,
    true for bool (jax.lax's defaults)."""
    mask = _in_range(t, ids, x.shape[axis])
    if list(ids.shape[:-1]) != mask_shape:
        mask = f"reshape({mask}, {_ints(mask_shape)})"
    return f"where({mask}, {t.emit(expr)}, {_fill_value(t, eqn, x)})"


def _fill_value(t, eqn, x) -> str:
    """A FILL_OR_DROP gather's fill value as an operand: its fill_value, else jax.lax's default
    (NaN for floats, the least signed or the largest unsigned integer, true for bool)."""
    fill = eqn.params.get("fill_value")
    dt = _np_dtype(x.dtype)
    if fill is None:
        fill = (np.nan if dt.kind == "f" or x.dtype == "bf16" else True if dt.kind == "b"
                else np.iinfo(dt).min if dt.kind == "i" else np.iinfo(dt).max)
    return t.value(t.constant(np.asarray(fill, dtype=dt), None))


def _jax_order(n: int, positions, dims, tag: str) -> list[tuple[str, int]]:
    """jax's order of n dims: the dims at `positions` are `dims` in turn (tagged `tag`), the
    others the batch dims 0, 1, ... (tagged "b")."""
    out, di, bi = [], 0, 0
    for pos in range(n):
        if pos in positions:
            out.append((tag, dims[di]))
            di += 1
        else:
            out.append(("b", bi))
            bi += 1
    return out


@prim("scatter-add", "scatter_add")
def _scatter_add(t, eqn, ins):
    x, ids, upd = ins
    dn = eqn.params["dimension_numbers"]
    rank = len(x.shape)
    op_batch = tuple(getattr(dn, "operand_batching_dims", ()))
    idx_batch = tuple(getattr(dn, "scatter_indices_batching_dims", ()))
    scattered = tuple(dn.scatter_dims_to_operand_dims)
    if len(ids.shape) == 1 and not op_batch and (len(scattered) > 1 or tuple(dn.inserted_window_dims) != scattered):
        return t.put(eqn, _window_scatter(t, eqn, x, ids, upd, dn, "{0} + {1}"))
    if len(dn.scatter_dims_to_operand_dims) > 1 and not op_batch:
        return t.put(eqn, _point_scatter_add(t, eqn, x, ids, upd, dn))
    if op_batch and not _along_axis_scatter_form(dn, ids, rank):
        return t.put(eqn, _point_scatter_add(t, eqn, x, ids, upd, dn))
    if len(dn.scatter_dims_to_operand_dims) != 1 or tuple(dn.inserted_window_dims) != \
            tuple(dn.scatter_dims_to_operand_dims) or ids.shape[-1] != 1:
        t.fail("jax primitive 'scatter-add' in a form other than scatter_add / the transpose of take_along_axis "
               "has no spmdlang equivalent")
    axis = int(dn.scatter_dims_to_operand_dims[0])
    ids_text = f"reshape({t.value(ids)}, {_ints(ids.shape[:-1])})"
    if "CLIP" in _mode(eqn):  # jax clamps the ids; FILL_OR_DROP and PROMISE_IN_BOUNDS drop (XLA's scatter)
        ids_text = f"clip({ids_text}, 0, {x.shape[axis] - 1})"
    nb = len(ids.shape) - 1
    if not op_batch:
        window = [d for d in range(rank) if d != axis]
        if len(dn.update_window_dims) != len(window) or \
                any(upd.shape[p] != x.shape[d] for p, d in zip(dn.update_window_dims, window)):
            t.fail("jax primitive 'scatter-add' of partial windows has no spmdlang equivalent")
        # ours: updates laid out x.shape[:axis] + ids.shape[:-1] + x.shape[axis+1:]
        ours = [("w", d) for d in range(axis)] + [("b", i) for i in range(nb)] + \
               [("w", d) for d in range(axis + 1, rank)]
        jax_order = _jax_order(len(upd.shape), dn.update_window_dims, window, "w")
        perm = [jax_order.index(k) for k in ours]
        u = t.value(upd)
        if perm != list(range(len(perm))):
            u = f"transpose({u}, {_ints(perm)})"
        return t.put(eqn, f"scatter_add({t.value(x)}, {ids_text}, {u}, axis={axis})")
    others = [d for d in range(rank) if d != axis]
    if list(op_batch) != others or list(idx_batch) != others or tuple(dn.update_window_dims) \
            or len(ids.shape) != rank + 1:
        t.fail("jax primitive 'scatter-add' in a form other than scatter_add / the transpose of take_along_axis "
               "has no spmdlang equivalent")
    # the transpose of take_along_axis: add each update at its id along `axis` (one_hot, summed over k)
    n = x.shape[axis]
    oh = t.emit(f"one_hot({ids_text}, {n}, dtype={x.dtype}) * expand_dims({t.value(upd)}, -1)")
    summed = f"sum({oh}, axis={axis})"
    if axis != rank - 1:
        perm = list(range(axis)) + [rank - 1] + list(range(axis, rank - 1))
        summed = f"transpose({t.emit(summed)}, {_ints(perm)})"
    return t.put(eqn, f"{t.value(x)} + {summed}")


# ----------------------------------------------------------------------------- calls and control

@prim("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "remat", "remat2", "checkpoint")
def _call(t, eqn, ins):
    p = eqn.params
    draw = _RANDOM_CALLS.get(p.get("name"))
    # (an f64 draw, under x64, is drawn from 64-bit bits: its body is inlined, and refused there
    # at the user's line)
    if draw is not None and ins and ins[0].shape == (2,) and is_key(eqn.invars[0].aval.dtype) \
            and dtype_name(t.out(eqn).dtype, t.where) != "f64":
        expr = draw(t, eqn, ins)
        if expr is not None:
            return t.put(eqn, expr)
    key = next(k for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if k in p)
    return t.inline(eqn, ins, key)


# jax.random's samplers are jitted functions of a key: one builtin each (None: inline the body)
def _static(t, r: Ref):
    """A Ref's value when it is known when traced (a literal or a constant of one value), else None."""
    if r.is_literal:
        return r.literal
    return t.known.get(r.text)


def _number(t, r: Ref) -> str | None:
    v = _static(t, r)
    return None if v is None else literal_text(v, r.dtype)


def _uniform(t, eqn, ins):
    if len(ins) != 3:
        return None
    order = _uniform_bounds(eqn.params.get("jaxpr"))
    if order is None:
        return None
    key, lo, hi = ins[0], _number(t, ins[order[0]]), _number(t, ins[order[1]])
    if lo is None or hi is None:
        return None
    return f"uniform({key.text}, {type_text(t.out(eqn))}, minval={lo}, maxval={hi})"


def _uniform_bounds(closed) -> tuple[int, int] | None:
    """Which of jax's _uniform(key, a, b) arguments is minval and which maxval, read from its body
    (its result is max(minval, ...)): a call with keywords passes them sorted by name, maxval
    first (jax.random.gumbel's), a positional call minval first. None: not that body."""
    jaxpr = getattr(closed, "jaxpr", closed)
    if jaxpr is None or len(jaxpr.invars) != 3 or not jaxpr.eqns:
        return None
    source = {v: i for i, v in enumerate(jaxpr.invars)}
    for e in jaxpr.eqns:  # an argument seen through its conversion and broadcasts
        if e.primitive.name in ("convert_element_type", "broadcast_in_dim", "reshape") \
                and e.invars and e.invars[0] in source:
            source[e.outvars[0]] = source[e.invars[0]]
    last = jaxpr.eqns[-1]
    if last.primitive.name != "max" or last.outvars != list(jaxpr.outvars):
        return None
    lo = next((source[v] for v in last.invars if not hasattr(v, "val") and v in source), None)
    if lo not in (1, 2):
        return None
    return lo, 3 - lo


def _normal(t, eqn, ins):
    return f"normal({ins[0].text}, {type_text(t.out(eqn))})" if len(ins) == 1 else None


def _bernoulli(t, eqn, ins):
    # (key, p); a traced gradient may have hoisted the sampler's constants into more arguments:
    # then its body (uniform(key) < p, which is bernoulli's definition) is inlined
    p = _number(t, ins[1]) if len(ins) == 2 else None
    return None if p is None else f"bernoulli({ins[0].text}, {p}, {type_text(t.out(eqn))})"


_RANDOM_CALLS = {"_uniform": _uniform, "_normal": _normal, "_bernoulli": _bernoulli}


@prim("random_wrap", "random_unwrap", "random_clone", "random_clone_p")
def _random_wrap(t, eqn, ins):
    return ins[0]


@prim("random_seed")
def _random_seed(t, eqn, ins):
    if getattr(eqn.params.get("impl"), "name", "threefry2x32") != "threefry2x32":
        t.fail("jax primitive 'random_seed' of a PRNG other than threefry2x32 has no spmdlang equivalent")
    return t.put(eqn, f"prng_key({ins[0].text})")


def _one_key(t, eqn, key: Ref):
    if key.shape != (2,):
        t.fail(f"jax primitive '{eqn.primitive.name}' on an array of keys has no spmdlang equivalent "
               "(one key at a time)")


@prim("random_fold_in")
def _random_fold_in(t, eqn, ins):
    key, data = ins
    _one_key(t, eqn, key)
    return t.put(eqn, f"fold_in({key.text}, {data.text})")


@prim("random_split")
def _random_split(t, eqn, ins):
    _one_key(t, eqn, ins[0])
    shape = tuple(eqn.params["shape"])
    if len(shape) != 1:
        t.fail("jax primitive 'random_split' into a shape of other than one dim has no spmdlang equivalent")
    return t.put(eqn, f"random_split({ins[0].text}, {shape[0]})")


@prim("random_bits")
def _random_bits(t, eqn, ins):
    _one_key(t, eqn, ins[0])
    if int(eqn.params["bit_width"]) != 32:
        t.fail(f"jax primitive 'random_bits' of {eqn.params['bit_width']} bits has no spmdlang equivalent (32)",
               note="under x64, jax draws f64 and i64 values (the default dtypes) from 64-bit bits; "
                    "ask for dtype=jnp.float32 or jnp.int32")
    out = t.put(eqn, f"random_bits({ins[0].text}, {type_text(t.out(eqn))})")
    t.origin[out.text] = ("bits", ins[0].text)
    return out


@prim("custom_vjp_call", "custom_vjp_call_jaxpr")
def _custom_vjp(t, eqn, ins):
    key = next(k for k in ("call_jaxpr", "fun_jaxpr") if k in eqn.params)
    return t.inline(eqn, ins, key)


@prim("sharding_constraint")
def _sharding_constraint(t, eqn, ins):
    x = ins[0]
    spec = spec_text(getattr(eqn.params["sharding"], "spec", None), len(x.shape), open_ok=True)
    if spec is None:
        return x
    return t.put(eqn, f"shard({t.value(x)}, {spec})")


@prim("reshard")
def _reshard(t, eqn, ins):
    """jax.sharding.reshard, and what jnp inserts to match its operands' shardings when it
    broadcasts: a layout on a mesh's Explicit axes (a shard()); on Auto axes it constrains nothing."""
    x = ins[0]
    sharding = eqn.params.get("dst_sharding")
    types = getattr(getattr(sharding, "mesh", None), "axis_types", ())
    if not any(getattr(a, "name", str(a)) == "Explicit" for a in types):
        return x
    spec = spec_text(getattr(sharding, "spec", None), len(x.shape))
    return x if spec is None else t.put(eqn, f"shard({t.value(x)}, {spec})")


def spec_text(spec, rank: int, open_ok: bool = False) -> str | None:
    """A PartitionSpec as the language's `{a, _, (b, c)}` (None when there is none)."""
    if spec is None or rank == 0:
        return None
    from jax.sharding import PartitionSpec as P

    entries = list(spec) + [None] * (rank - len(tuple(spec)))
    out = []
    for e in entries:
        if e is None:
            out.append("_")
        elif e is P.UNCONSTRAINED:
            out.append("?" if open_ok else "_")
        elif isinstance(e, (tuple, list)):
            out.append("(" + ", ".join(e) + ")" if len(e) > 1 else (e[0] if e else "_"))
        else:
            out.append(str(e))
    return "{" + ", ".join(out) + "}"


@prim("platform_index")
def _platform_index(t, eqn, ins):
    """lax.platform_dependent's choice of branch (jnp.diagonal's: a Pallas kernel's form, or
    the default): the one for "cpu" where there is one, else the default. The branches compute
    the same values; the program's ref and sim compute as jax on CPU does."""
    platforms = list(eqn.params["platforms"])
    pick = next((j for j, ps in enumerate(platforms) if ps is not None and "cpu" in ps), None)
    if pick is None:
        pick = next((j for j, ps in enumerate(platforms) if ps is None), None)
    if pick is None:
        t.fail(f"jax primitive 'platform_index' over the platforms {platforms} only, with no branch for cpu "
               "and no default, has no spmdlang equivalent")
    return t.constant(np.int32(pick), None)


@prim("cond")
def _cond(t, eqn, ins):
    index, *ops = ins
    branches = eqn.params["branches"]
    known = _static(t, index)
    if known is not None:  # (platform_index's choice, a constant predicate): that branch alone
        j = int(bool(known)) if index.dtype == "bool" else min(max(int(known), 0), len(branches) - 1)
        return list(t.closed(branches[j], ops))
    results = [t.closed(b, ops) for b in branches]
    outs = []
    for k in range(len(eqn.outvars)):
        if len(results) == 1:
            outs.append(results[0][k])
            continue
        acc = t.value(results[-1][k])
        for j in range(len(results) - 2, -1, -1):
            cond = f"{t.value(index)} == {j}" if index.dtype != "bool" else (t.value(index) if j else
                                                                             f"logical_not({t.value(index)})")
            acc = t.emit(f"where({cond}, {t.value(results[j][k])}, {acc})")
        outs.append(t.ref(acc, t.out(eqn, k)))
    return outs


def _zeros_text(ref_dtype: str, shape) -> str:
    return f"zeros({ref_dtype}[{', '.join(map(str, shape))}])"


def _carries_in(t, init) -> list[Ref]:
    """A loop's carries: each initial value copied into a variable of its own."""
    carries = []
    for r in init:
        c = t.body.new("carry")
        t.line(f"{t.indent}{c} = {t.value(r)}")
        carries.append(Ref(c, r.dtype, r.shape))
    return carries


def _open_loop(t, trips: int) -> tuple[str, str]:
    """Open `loop iN in range(trips) {`: (the loop variable, the indent outside)."""
    loopvar = t.body.new(fixed=f"i{t.loops}")
    t.loops += 1
    t.line(f"{t.indent}loop {loopvar} in range({trips}) {{")
    outer = t.indent
    t.indent += "  "
    return loopvar, outer


def _close_loop(t, carries, new, outer: str) -> None:
    """Write the next carries and close the loop; every new carry is read before any is written
    (a body may swap its carries)."""
    staged = []
    for c, r in zip(carries, new):
        v = t.value(r)
        if any(v == other.text for other in carries):
            v = t.emit(v)
        staged.append((c, v))
    for c, v in staged:
        if c.text != v:
            t.line(f"{t.indent}{c.text} = {v}")
    t.indent = outer
    t.line(f"{t.indent}}}")


@prim("scan")
def _scan(t, eqn, ins):
    p = eqn.params
    n, nc, ncarry = int(p["length"]), int(p["num_consts"]), int(p["num_carry"])
    consts, init, xs = ins[:nc], ins[nc:nc + ncarry], ins[nc + ncarry:]
    body = p["jaxpr"]
    ys_avals = [v.aval for v in eqn.outvars[ncarry:]]
    carries = _carries_in(t, init)
    ys = []
    for aval in ys_avals:
        y = t.body.new("stacked")
        t.line(f"{t.indent}{y} = {_zeros_text(dtype_name(aval.dtype, t.where), aval_shape(aval))}")
        ys.append(Ref(y, dtype_name(aval.dtype, t.where), aval_shape(aval)))
    loopvar, outer = _open_loop(t, n)
    index = loopvar
    if p["reverse"]:
        index = t.emit(f"{n - 1} - {loopvar}")
    x_refs = []
    for r in xs:
        rest = ", :" * (len(r.shape) - 1)
        x_refs.append(Ref(t.emit(f"{t.value(r)}[{index}{rest}]"), r.dtype, r.shape[1:]))
    outs = t.closed(body, [*consts, *carries, *x_refs])
    new_carry, new_ys = outs[:ncarry], outs[ncarry:]
    for y, r in zip(ys, new_ys):
        starts = ", ".join([index] + ["0"] * len(r.shape))
        t.line(f"{t.indent}{y.text} = dynamic_update_slice({y.text}, "
                            f"expand_dims({t.value(r)}, 0), [{starts}])")
    _close_loop(t, carries, new_carry, outer)
    return [*carries, *ys]


@prim("while")
def _while(t, eqn, ins):
    """A while loop whose trip count is known when traced: a counter carry compared with a bound
    known when traced (fori_loop's i < n, or <=, >, >=, !=) and stepped by a constant."""
    p = eqn.params
    cn, bn = int(p["cond_nconsts"]), int(p["body_nconsts"])
    cconsts, bconsts, init = ins[:cn], ins[cn:cn + bn], ins[cn + bn:]
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    trip = _trip_count(cond, body, cconsts, init, bn)
    if trip is None:
        t.fail("jax primitive 'while' whose trip count is not known when traced has no spmdlang equivalent: "
               "its condition must compare a counter with a bound known when traced (i < n, <=, >, >=, !=), "
               "the body step the counter by a constant, and it must stop within "
               f"{_MAX_TRIPS:,} steps (fori_loop and scan with static bounds are)")
    carries = _carries_in(t, init)
    _, outer = _open_loop(t, trip)
    outs = t.closed(body, [*bconsts, *carries])
    _close_loop(t, carries, outs, outer)
    return carries


_MAX_TRIPS = 10_000_000
_COMPARE = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
            "ge": lambda a, b: a >= b, "ne": lambda a, b: a != b}
_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "ne": "ne"}


def _trip_count(cond, body, cconsts, init, bn) -> int | None:
    """How many times the body runs, when cond is `carry[k] <op> N` (either side) with the start
    and N known when traced, and the body adds a constant to carry[k]; else None."""
    cj, bj = cond.jaxpr, body.jaxpr
    if len(cj.eqns) != 1 or cj.eqns[0].primitive.name not in _COMPARE:
        return None
    cvars = list(cj.invars)
    nc = len(cconsts)

    def carry_index(v):
        return cvars.index(v) - nc if not hasattr(v, "val") and v in cvars and cvars.index(v) >= nc else None

    def static(v):
        if hasattr(v, "val"):
            return np.asarray(v.val).item()
        if not hasattr(v, "val") and v in cvars[:nc] and cconsts[cvars.index(v)].is_literal:
            return cconsts[cvars.index(v)].literal
        j = carry_index(v)
        if j is not None and init[j].is_literal and _unchanged(bj, bn + j):
            return init[j].literal
        return None

    name = cj.eqns[0].primitive.name
    a, b = cj.eqns[0].invars
    k, bound = carry_index(a), static(b)
    if k is None or bound is None:
        k, bound, name = carry_index(b), static(a), _FLIPPED[name]
    if k is None or bound is None or not init[k].is_literal or not isinstance(init[k].literal, (int, np.integer)):
        return None
    counter, out, step = bj.invars[bn + k], bj.outvars[k], None
    for e in bj.eqns:
        if e.outvars[0] is out and e.primitive.name in ("add", "sub"):
            x, y = e.invars
            if x is counter and hasattr(y, "val"):
                step = np.asarray(y.val).item() * (1 if e.primitive.name == "add" else -1)
            elif y is counter and hasattr(x, "val") and e.primitive.name == "add":
                step = np.asarray(x.val).item()
    if not isinstance(step, int) or step == 0:
        return None
    trips = _trips(name, int(init[k].literal), int(bound), step)
    return trips if trips is not None and trips <= _MAX_TRIPS else None


def _trips(name: str, start: int, bound: int, step: int) -> int | None:
    """How many steps of `step` from `start` keep `i <name> bound` true (in closed form: a loop of
    millions counts as fast as one of three); None when it never turns false."""
    if not _COMPARE[name](start, bound):
        return 0
    gap = bound - start
    if name == "ne":
        return gap // step if gap % step == 0 and gap // step > 0 else None
    if (name in ("lt", "le")) != (step > 0):  # stepping away from the bound
        return None
    n, s = abs(gap), abs(step)
    return -(-n // s) if name in ("lt", "gt") else n // s + 1


def _unchanged(jaxpr, i) -> bool:
    return jaxpr.outvars[i] is jaxpr.invars[i]
