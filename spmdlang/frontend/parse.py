"""Text -> AST. Lark LALR parse, then a transformer building ast nodes with spans.

Syntax errors become one SpmdError at the offending token, saying what was found and, in words,
what could have come there instead.
"""

from __future__ import annotations

import re
from functools import cache, partial
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError
from lark.lexer import PatternStr, UnlessCallback
from lark.parse_tree_builder import (
    ChildFilterLALR,
    ChildFilterLALR_NoPlaceholders,
    ExpandSingleChild,
    PropagatePositions,
)
from lark.parsers.lalr_analysis import Shift
from lark.visitors import Transformer_NonRecursive

from ..errors import Source, Span, SpmdError
from ..limits import MAX_NESTING, MAX_SOURCE_BYTES, format_bytes
from . import ast as A

_KEYWORDS = {"mesh", "devices", "const", "struct", "func", "return", "for", "loop", "in", "range", "true", "false"}

# terminal name -> words for "expected ..." messages
_TERMINALS = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "STRING": "a string",
    "LSQB": "'['", "RSQB": "']'", "LPAR": "'('", "RPAR": "')'", "LBRACE": "'{'", "RBRACE": "'}'",
    "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "SEMICOLON": "';'", "MINUS": "'-'",
    "QMARK": "'?'", "__ANON_0": "'->'", "BODY_LBRACE": "'{'", "COMP_OP": "a comparison", "PLUS": "'+'",
    "MUL_OP": "'*', '/' or '@'", "DOT": "'.'", "$END": "end of file", "MORETHAN": "'>'",
}


class _BodyBrace:
    """Post-lexer: a `{` after `]` or a name opens a spec when its matching `}` is followed by `{`,
    `,` or `)` (more signature follows); otherwise it opens a body (a function's, or a struct's).
    Inside a struct's body every `{` opens a field's spec. LALR(1) cannot see that."""

    always_accept = ()

    def process(self, stream):
        buf = list(stream)
        depth_match = {}
        stack = []
        for i, t in enumerate(buf):
            if t.type == "LBRACE":
                stack.append(i)
            elif t.type == "RBRACE" and stack:
                depth_match[stack.pop()] = i
        in_struct_until = -1
        for i, t in enumerate(buf):
            if t.type == "LBRACE" and i >= 2 and buf[i - 2].type == "STRUCT":
                in_struct_until = depth_match.get(i, len(buf))
                t = Token.new_borrow_pos("BODY_LBRACE", t, t)
            elif t.type == "LBRACE" and i > 0 and buf[i - 1].type in ("RSQB", "NAME") and i > in_struct_until:
                j = depth_match.get(i, len(buf)) + 1
                follows = buf[j].type if j < len(buf) else "$END"
                if follows not in ("LBRACE", "COMMA", "RPAR"):
                    t = Token.new_borrow_pos("BODY_LBRACE", t, t)
            yield t


class _Positions:
    """What lark's PropagatePositions (propagate_positions=True) records on each tree node, kept
    as references, not copied into a Meta: a node starts where its first positioned child's
    container starts and ends where its last one's ends (`_first`, `_last`: set once, so an
    inlined `?rule` keeps its child's own); its container spans all of the rule's symbols,
    filtered tokens included (`_cfirst`, `_clast`: set by every reduction that returns it).
    _span reads them when a node's span is asked for: lark's copying of twelve attributes per
    node was half of the parse."""

    __slots__ = ("node_builder",)

    def __init__(self, node_builder):
        self.node_builder = node_builder

    def __call__(self, children):
        res = self.node_builder(children)
        if isinstance(res, Tree):
            first = _edge(children)
            if first is not None:
                last = _edge(reversed(children))
                d = res.__dict__
                d.setdefault("_first", first)
                d.setdefault("_last", last)
                if first is not res:  # (an inlined rule's single child is its own first: as it was)
                    d["_cfirst"] = first
                if last is not res:
                    d["_clast"] = last
        return res


def _edge(children):
    """The first child that has a position: a token, or a tree with one (lark's _pp_get_meta)."""
    for c in children:
        if isinstance(c, Token):
            return c
        if isinstance(c, Tree) and "_cfirst" in c.__dict__:
            return c
    return None


def _container_edge(x, side: str, cached: str, pos) -> tuple[int, int]:
    """(line, column) where token or tree `x`'s container starts (`side` "_cfirst") or ends
    ("_clast"), each tree on the way remembering it (spans are asked for bottom-up)."""
    path = []
    while not isinstance(x, Token):
        d = x.__dict__
        got = d.get(cached)
        if got is not None:
            break
        path.append(d)
        x = d[side]
    else:
        got = pos(x)
    for d in path:
        d[cached] = got
    return got


@cache
def _parser() -> Lark:
    """Built once per process. Its rules' position callbacks are lark's PropagatePositions
    swapped for _Positions (where this lark has them: otherwise lark's own Meta stays)."""
    grammar = resources.files("spmdlang").joinpath("grammar.lark").read_text()
    parser = Lark(grammar, parser="lalr", lexer="basic", postlex=_BodyBrace(), propagate_positions=True,
                  maybe_placeholders=True)
    callbacks = getattr(parser, "_callbacks", None)  # the dict the LALR parser reduces with
    for rule, f in (callbacks or {}).items():
        if type(f) is PropagatePositions and f.node_filter is None:
            callbacks[rule] = _Positions(f.node_builder)
    return parser


_parser.keep_on_clear = True  # the grammar's tables: setup, not a result (memo.clear_caches)


class _Fast:
    """lark's own tables, run by a tighter loop: the lexer's compiled regex over the whole text
    (keywords retyped as its UnlessCallback does) and the LALR table with each reduction's
    (length, callback, goto symbol) looked up once per grammar, not per token. The same tokens,
    reductions and tree as lark's parse; any text it does not accept is handed back to lark
    (`_fast_tree` returns None), whose exception makes the error message."""

    def __init__(self, parser: Lark):
        frontend = parser.parser
        lexer = frontend.lexer.lexer  # (PostLexConnector -> BasicLexer)
        scanner = lexer.scanner  # (builds lexer.callback)
        if len(scanner._mres) != 1:
            raise LookupError("several regexes")
        self.regex = scanner._mres[0]
        self.newline = lexer.newline_types
        self.ignore = lexer.ignore_types
        self.retype: dict[str, dict[str, str]] = {}
        for name, cb in lexer.callback.items():
            terms = getattr(cb, "scanner", None) and cb.scanner.terminals
            if type(cb) is not UnlessCallback or not all(type(t.pattern) is PatternStr and not t.pattern.flags
                                                         for t in terms):
                raise LookupError("a lexer callback")
            self.retype[name] = {t.pattern.value: t.name for t in terms}
        lalr = frontend.parser.parser
        table, callbacks = lalr.parse_table, lalr.callbacks
        if any(isinstance(k, str) for k in callbacks) or list(parser.options.start) != ["start"]:
            raise LookupError("terminal callbacks")
        self.start, self.end = table.start_states["start"], table.end_states["start"]
        # (symbol names as plain str: lark's are Tokens, whose __eq__ every lookup would call)
        self.states = {state: {str(term): (True, arg) if action is Shift else
                               (False, (len(arg.expansion), _fused(_unit(arg, callbacks[arg])),
                                        str(arg.origin.name)))
                               for term, (action, arg) in acts.items()}
                       for state, acts in table.states.items()}

    def tokens(self, text: str) -> list[Token] | None:
        """lark's BasicLexer tokens of `text` (positions as its LineCounter counts them), or None
        where some character starts no token."""
        out = []
        new, newline, ignore, retype = Token._future_new, self.newline, self.ignore, self.retype
        pos, line, line_start = 0, 1, 0
        for m in self.regex.finditer(text):
            if m.start() != pos:
                return None
            value, kind = m.group(), m.lastgroup
            end, end_line, end_start = pos + len(value), line, line_start
            if kind in newline:
                n = value.count("\n")
                if n:
                    end_line, end_start = line + n, pos + value.rindex("\n") + 1
            if kind not in ignore:
                if kind in retype:
                    kind = retype[kind].get(value, kind)
                out.append(new(kind, value, pos, line, pos - line_start + 1, end_line, end - end_start + 1, end))
            pos, line, line_start = end, end_line, end_start
        return out if pos == len(text) else None

    def tree(self, text: str) -> Tree | None:
        tokens = self.tokens(text)
        if tokens is None:
            return None
        states, end_state = self.states, self.end
        state_stack, value_stack = [self.start], []
        last = None
        for tok in _BodyBrace().process(tokens):
            last = tok
            kind = tok.type
            while True:
                act = states[state_stack[-1]].get(kind)
                if act is None:
                    return None
                shift, arg = act
                if shift:
                    state_stack.append(arg)
                    value_stack.append(tok)
                    break
                size, callback, origin = arg
                if callback is None:  # (a `?rule` of one symbol: its value is its child's)
                    state_stack[-1] = states[state_stack[-2]][origin][1]
                    continue
                if size:
                    s = value_stack[-size:]
                    del state_stack[-size:]
                    del value_stack[-size:]
                else:
                    s = []
                value_stack.append(callback(s))
                state_stack.append(states[state_stack[-1]][origin][1])
        end = Token.new_borrow_pos("$END", "", last) if last is not None else Token("$END", "", 0, 1, 1)
        while True:
            act = states[state_stack[-1]].get(end.type)
            if act is None or act[0]:
                return None
            size, callback, origin = act[1]
            if callback is None:
                state_stack[-1] = states[state_stack[-2]][origin][1]
                if state_stack[-1] == end_state:
                    return value_stack[-1]
                continue
            if size:
                s = value_stack[-size:]
                del state_stack[-size:]
                del value_stack[-size:]
            else:
                s = []
            value_stack.append(callback(s))
            state_stack.append(states[state_stack[-1]][origin][1])
            if state_stack[-1] == end_state:
                return value_stack[-1]


def _unit(rule, callback):
    """None for a reduction that returns its one child as it is: a `?rule` of one symbol, whose
    _Positions finds nothing to record (the child is a token, or a tree with its positions set, or
    one without any); else the callback."""
    if (len(rule.expansion) == 1 and type(callback) is _Positions
            and type(callback.node_builder) is ExpandSingleChild):
        return None
    return callback


def _fused(callback):
    """A reduction's callback as one function: _Positions over lark's child filter (which drops
    filtered tokens, splices `_rule` children and fills placeholders) over a Tree constructor, as
    they run in turn, without the two calls in between (lark builds a chain per rule). The same
    tree and positions; any other chain is left as lark built it."""
    if type(callback) is not _Positions:
        return callback
    build = callback.node_builder
    include, append_none = None, 0
    if type(build) is ChildFilterLALR:
        include, append_none, build = build.to_include, build.append_none, build.node_builder
    elif type(build) is ChildFilterLALR_NoPlaceholders:
        include, build = [(i, expand, 0) for i, expand in build.to_include], build.node_builder
    if type(build) is not partial or build.func is not Tree or build.keywords or len(build.args) != 1:
        return callback
    name = build.args[0]

    def reduce(children):
        filtered = children
        if include is not None:
            filtered = []
            for i, to_expand, add_none in include:  # (lark's ChildFilterLALR, as it is)
                if add_none:
                    filtered += [None] * add_none
                if to_expand:
                    if filtered:
                        filtered += children[i].children
                    else:
                        filtered = children[i].children
                else:
                    filtered.append(children[i])
            if append_none:
                filtered += [None] * append_none
        res = Tree(name, filtered)
        first = _edge(children)  # (_Positions, as it is: a new tree's own edges, then its container's)
        if first is not None:
            last = _edge(reversed(children))
            d = res.__dict__
            d["_first"] = first
            d["_last"] = last
            d["_cfirst"] = first
            d["_clast"] = last
        return res

    return reduce


@cache
def _fast() -> _Fast | None:
    try:
        return _Fast(_parser())
    except (LookupError, AttributeError):  # a lark whose internals differ: its own parse runs
        return None


_fast.keep_on_clear = True  # (the same tables, arranged: setup)


def _describe_terminal(name: str) -> str:
    if name in _TERMINALS:
        return _TERMINALS[name]
    try:
        pattern = _parser().get_terminal(name).pattern.value
    except KeyError:
        return name.lower()
    return f"'{pattern}'"


def _describe_token(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    if tok.type == "NAME":
        return f"name '{tok}'"
    if str(tok) in _KEYWORDS:
        return f"keyword '{tok}'"
    return f"'{tok}'"


def _expected_words(expected) -> str:
    words = sorted({_describe_terminal(t) for t in expected})
    # keywords are long alternatives nobody wants to read; an expression is the usual need
    if any(w in ("a name", "an integer") for w in words) and len(words) > 6:
        words = [w for w in words if w not in ("an integer", "a number", "a string", "'-'", "'('", "'['",
                                               "'{'", "'true'", "'false'")]
        words = [w for w in words if w != "a name"] + ["an expression"]
    if len(words) > 8:
        words = words[:8] + ["..."]
    return ", ".join(words)


def _end_of_text(text: str) -> tuple[int, int]:
    """Just past the last non-blank character; lines counted as the lexer counts them (by \\n)."""
    lines = text.rstrip().split("\n")
    return len(lines), len(lines[-1]) + 1


def _unclosed_brace(text: str) -> tuple[int, int] | None:
    """The `{` (line, col) that is never closed in `text`; None when every brace is closed. A `}`
    that starts its line closes the brace opened on a line indented as it is: braces opened on more
    indented lines in between are the ones left open (the usual way a `}` goes missing), the first
    of them reported."""
    opens: list[tuple[int, int, int]] = []  # (line, col, indentation of the opening line)
    lost: tuple[int, int] | None = None
    for n, raw in enumerate(text.split("\n"), start=1):
        code = re.sub(r'"[^"\n]*"', lambda m: " " * len(m.group()), raw).split("#", 1)[0]
        indent = len(code) - len(code.lstrip())
        for i, ch in enumerate(code):
            if ch == "{":
                opens.append((n, i + 1, indent))
            elif ch == "}" and opens:
                if i == indent:  # first on its line: skip past braces opened further in
                    while len(opens) > 1 and opens[-1][2] > indent:
                        line, col, _ = opens.pop()
                        lost = lost or (line, col)
                opens.pop()
    if lost is not None:
        return lost
    return (opens[-1][0], opens[-1][1]) if opens else None


def unclosed_error(source: Source, at: tuple[int, int], found: str) -> SpmdError:
    line, col = at
    return SpmdError(f"this '{{' is never closed: expected '}}' before {found}", Span(source, line, col, line, col + 1))


def _syntax_error(e: UnexpectedInput, source: Source) -> SpmdError:
    line, col = max(e.line, 1), max(e.column, 1)
    if isinstance(e, UnexpectedCharacters):
        ch = e.char
        msg = f"unexpected character '{ch}'" if ch.isprintable() else f"unexpected character U+{ord(ch):04X}"
        if ch == '"':
            msg = "unterminated string"
        return SpmdError(msg, Span(source, line, col, line, col + 1))
    if isinstance(e, UnexpectedEOF):
        unclosed = _unclosed_brace(source.text) if "RBRACE" in e.expected else None
        if unclosed is not None:
            return unclosed_error(source, unclosed, "end of file")
        line, col = _end_of_text(source.text)
        return SpmdError(f"unexpected end of file; expected {_expected_words(e.expected)}",
                         Span(source, line, col))
    assert isinstance(e, UnexpectedToken)
    tok = e.token
    if "RBRACE" in e.expected:
        unclosed = _unclosed_brace(source.text)
        if unclosed is not None and (tok.type == "$END" or unclosed < (line, col)):
            return unclosed_error(source, unclosed, _describe_token(tok))
    if tok.type == "$END":
        line, col = _end_of_text(source.text)
    msg = f"unexpected {_describe_token(tok)}; expected {_expected_words(e.expected)}"
    if str(tok) in _KEYWORDS and "NAME" in e.expected:
        msg += f" ('{tok}' is a keyword and cannot be used as a name)"
    end = col + max(len(str(tok)), 1) if tok.type != "$END" else col + 1
    return SpmdError(msg, Span(source, line, col, line, end))


def parse(text: str, filename: str = "<input>") -> tuple[A.Module, Source]:
    """Parse source text into an AST Module. Raises SpmdError on syntax errors."""
    # a byte-order mark is an encoding detail, not a character; a lone \r ends a line, as in Python
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    source = Source(filename, text)
    if len(text) > MAX_SOURCE_BYTES:
        raise SpmdError(f"the program is {format_bytes(len(text))} long; at most {format_bytes(MAX_SOURCE_BYTES)} "
                        "of source is accepted", Span(source, 1, 1))
    fast = _fast()
    tree = fast.tree(text) if fast is not None else None
    try:
        if tree is None:  # (lark's parse: what the fast one does not accept, it reports)
            tree = _parser().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(e, source) from None
    _check_nesting(tree, source)
    try:
        return _ToAst(source).transform(tree), source
    except VisitError as e:
        if isinstance(e.orig_exc, SpmdError):
            raise e.orig_exc from None
        raise


def _check_nesting(tree: Tree, source: Source) -> None:
    """Expressions and blocks nest at most MAX_NESTING deep (a chain of binary operators nests one
    level per operator): past that, a located error instead of exhausting the compiler's stack."""
    stack = [(tree, 1)]
    while stack:
        t, depth = stack.pop()
        if depth > MAX_NESTING:
            raise SpmdError(f"the program nests more than {MAX_NESTING} levels deep here (calls, indexing, "
                            "blocks, and each operator of a chain count one level; parentheses do not); split it with "
                            "assignments", _span(source, t))
        stack.extend((c, depth + 1) for c in t.children if isinstance(c, Tree))


def _span(source: Source, tree: Tree) -> Span:
    d = tree.__dict__
    if "_first" in d:  # (_Positions)
        line, col = _container_edge(d["_first"], "_cfirst", "_cstart", lambda t: (t.line, t.column))
        end_line, end_col = _container_edge(d["_last"], "_clast", "_cend", lambda t: (t.end_line, t.end_column))
        return Span(source, line, col, end_line, end_col)
    meta = tree.meta
    if getattr(meta, "empty", False) or not hasattr(meta, "line"):
        return Span(source, 1, 1)
    return Span(source, meta.line, meta.column, meta.end_line, meta.end_column)


def _tok_span(source: Source, tok: Token) -> Span:
    return Span(source, tok.line, tok.column, tok.end_line, tok.end_column)


class _ToAst(Transformer_NonRecursive):
    """Parse tree -> AST, bottom-up without recursion (deep programs need no deep stack here).
    Each rule's method takes (its tree, for `sp`, and its children)."""

    __visit_tokens__ = False

    def __init__(self, source: Source):
        super().__init__(visit_tokens=False)
        self.source = source

    def _call_userfunc(self, tree, new_children=None):
        # call rule methods directly: lark's v_args wrappers cost a functools.update_wrapper per node
        children = new_children if new_children is not None else tree.children
        return getattr(self, tree.data)(tree, children)

    def sp(self, tree) -> Span:
        return _span(self.source, tree)

    # ---- top level
    def start(self, meta, items):
        items = [i for i in items if isinstance(i, A.Node)]
        return A.Module(self.sp(meta), [i for i in items if isinstance(i, A.MeshDecl)],
                        [i for i in items if isinstance(i, A.ConstDecl)],
                        [i for i in items if isinstance(i, A.FuncDef)],
                        [i for i in items if isinstance(i, A.StructDecl)])

    def mesh_decl(self, meta, children):
        axes = [c for c in children if isinstance(c, A.MeshAxis)]
        ids, ids_span = next((c for c in children if isinstance(c, tuple)), (None, None))
        return A.MeshDecl(self.sp(meta), axes, ids, ids_span)

    def mesh_axis(self, meta, children):
        name, size = children
        return A.MeshAxis(_tok_span(self.source, name), str(name), size)

    def devices(self, meta, children):
        return ([c for c in children if c is not None], self.sp(meta))

    def const_decl(self, meta, children):
        name, value = children
        return A.ConstDecl(_tok_span(self.source, name), str(name), value)

    def struct_decl(self, meta, children):
        name, *fields = children
        return A.StructDecl(_tok_span(self.source, name), str(name),
                            [f for f in fields if isinstance(f, A.FieldDecl)])

    def field_decl(self, meta, children):
        name, type_, spec = children
        return A.FieldDecl(_tok_span(self.source, name), str(name), type_, spec)

    def func_def(self, meta, children):
        name, type_params, *rest = children
        body = rest[-1]
        results, parenthesised = rest[-2]
        params = [p for p in rest[:-2] if p is not None]
        return A.FuncDef(self.sp(meta), str(name), params, results, parenthesised, body, type_params or [])

    def type_params(self, meta, children):
        return [str(c) for c in children]

    def param(self, meta, children):
        name, type_, spec = children
        return A.Param(_tok_span(self.source, name), str(name), type_, spec)

    def results(self, meta, children):
        return (list(children), False)

    def result_list(self, meta, children):
        return ([c for c in children if c is not None], True)

    def result_type(self, meta, children):
        type_, spec = children
        return A.ResultType(self.sp(meta), type_, spec)

    def type(self, meta, children):
        name, *dims = children
        return A.TypeExpr(self.sp(meta), str(name), [d for d in dims if d is not None],
                          _tok_span(self.source, name))

    def bare_type(self, meta, children):
        (name,) = children
        return A.TypeExpr(self.sp(meta), str(name), None, _tok_span(self.source, name))

    def shape_var(self, meta, children):
        (name,) = children
        return A.ShapeVar(self.sp(meta), str(name))

    def spec(self, meta, children):
        return A.SpecExpr(self.sp(meta), [c for c in children if c is not None])

    def spec_axis(self, meta, children):
        (name,) = children
        return A.SpecEntry(_tok_span(self.source, name), (str(name),))

    def spec_open(self, meta, children):
        return A.SpecEntry(self.sp(meta), None)

    def spec_group(self, meta, children):
        return A.SpecEntry(self.sp(meta), tuple(str(c) for c in children))

    # ---- statements
    def block(self, meta, children):
        return [c for c in children if isinstance(c, A.Node)]

    def body(self, meta, children):
        return [c for c in children if isinstance(c, A.Node)]

    def assign(self, meta, children):
        name, value = children
        return A.Assign(_tok_span(self.source, name), str(name), value)

    def multi_assign(self, meta, children):
        *names, value = children
        return A.MultiAssign(self.sp(meta), [str(n) for n in names], value,
                             [_tok_span(self.source, n) for n in names])

    def return_stmt(self, meta, children):
        return A.Return(self.sp(meta), list(children))

    def for_stmt(self, meta, children):
        var, *args, body = children
        return A.For(self.sp(meta), str(var), args, body)

    def loop_stmt(self, meta, children):
        var, *args, body = children
        return A.Loop(self.sp(meta), str(var), args, body, _tok_span(self.source, var))

    # ---- expressions
    def compare(self, meta, children):
        left, op, right = children
        return A.Compare(_tok_span(self.source, op), str(op), left, right)

    def binop(self, meta, children):
        left, op, right = children
        return A.BinOp(_tok_span(self.source, op), str(op), left, right)

    def negate(self, meta, children):
        _minus, x = children
        return A.Neg(self.sp(meta), x)

    def pow(self, meta, children):
        base, exponent = children
        return A.Pow(self.sp(meta), base, exponent)

    def call(self, meta, children):
        name, args = children
        args = args or ([], [])
        return A.Call(self.sp(meta), str(name), args[0], args[1], _tok_span(self.source, name))

    def args(self, meta, children):
        pos = [c for c in children if not isinstance(c, A.Keyword)]
        kws = [c for c in children if isinstance(c, A.Keyword)]
        for i, c in enumerate(children):
            if not isinstance(c, A.Keyword) and any(isinstance(k, A.Keyword) for k in children[:i]):
                raise SpmdError("positional argument after a keyword argument", c.span)
        return (pos, kws)

    def kwarg(self, meta, children):
        name, value = children
        return A.Keyword(_tok_span(self.source, name), str(name), value)

    def subscript(self, meta, children):
        base, *indices = children
        return A.Subscript(self.sp(meta), base, [i for i in indices if i is not None])

    def attribute(self, meta, children):
        base, name = children
        return A.Attribute(self.sp(meta), base, str(name))

    def slice_index(self, meta, children):
        start, stop, step = children
        return A.SliceIndex(self.sp(meta), start, stop, step)

    def name(self, meta, children):
        (tok,) = children
        return A.Name(_tok_span(self.source, tok), str(tok))

    def int_lit(self, meta, children):
        (tok,) = children
        return A.IntLit(_tok_span(self.source, tok), int(tok))

    def float_lit(self, meta, children):
        (tok,) = children
        return A.FloatLit(_tok_span(self.source, tok), float(tok))

    def string_lit(self, meta, children):
        (tok,) = children
        return A.StrLit(_tok_span(self.source, tok), str(tok)[1:-1])

    def true_lit(self, meta, children):
        return A.BoolLit(self.sp(meta), True)

    def false_lit(self, meta, children):
        return A.BoolLit(self.sp(meta), False)

    def tuple_lit(self, meta, children):
        return A.TupleLit(self.sp(meta), [c for c in children if c is not None])

    def list_lit(self, meta, children):
        return A.ListLit(self.sp(meta), [c for c in children if c is not None])
