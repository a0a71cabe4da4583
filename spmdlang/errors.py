"""Source positions and the one exception type a user can cause.

Everything a user can get wrong (syntax, types, shapes, shardings, inputs) raises `SpmdError`
carrying a `Span`; anything else escaping the compiler is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class Source:
    """A named source text; spans point into it."""

    name: str
    text: str

    def line_text(self, line: int) -> str:
        # count lines as the lexer does: by "\n" only (splitlines() also breaks at \x0c, \u2028, ...)
        lines = self.text.split("\n")
        return lines[line - 1].rstrip("\r") if 1 <= line <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    """A source range, 1-based line and column, end exclusive."""

    source: Source | None
    line: int
    col: int
    end_line: int | None = None
    end_col: int | None = None

    @property
    def file(self) -> str:
        return self.source.name if self.source else "<input>"


class SpmdError(Exception):
    """A user error with a source position: `FILE:LINE:COL: error: MESSAGE`."""

    def __init__(self, message: str, span: Span | None = None, note: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.note = note

    @property
    def line(self) -> int | None:
        return self.span.line if self.span else None

    @property
    def col(self) -> int | None:
        return self.span.col if self.span else None

    @property
    def file(self) -> str | None:
        return self.span.file if self.span else None

    def render(self) -> str:
        """The message as printed by the CLI: location, message, source line and a caret."""
        if self.span is None:
            text = f"error: {self.message}"
        else:
            s = self.span
            text = f"{s.file}:{s.line}:{s.col}: error: {self.message}"
            src = s.source.line_text(s.line) if s.source else ""
            if src:
                width = 1
                if s.end_line == s.line and s.end_col and s.end_col > s.col:
                    width = s.end_col - s.col
                width = max(1, min(width, len(src) - s.col + 1))
                text += f"\n{src}\n{' ' * (s.col - 1)}^{'~' * (width - 1)}"
        if self.note:
            text += f"\nnote: {self.note}"
        return text

    def __str__(self) -> str:
        return self.render()


class OverrideError(SpmdError):
    """--mesh / --set (or the API's mesh=/consts=) name something the program lacks: the command
    line is wrong, so the CLI exits with status 2."""


class ShapeError(Exception):
    """Raised by op-table rules (which know no spans); the IR builder re-raises it as SpmdError.
    `blame` names what is wrong: an operand (its index) or an attribute (its name); the builder
    locates the error there when the caller gave that argument's span."""

    def __init__(self, message: str, blame: int | str | None = None):
        super().__init__(message)
        self.blame = blame
