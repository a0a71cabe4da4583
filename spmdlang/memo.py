"""The compiler's process-level memos, and how to forget them.

Pure functions of small immutable questions (a reshard plan, an einsum's parse, a halo window) are
memoised with functools.lru_cache where the partitioner asks the same question many times; the
answers outlive one compile. clear_caches() forgets them, so that a benchmark can time a compile as
a fresh process pays for it. Imports nothing: it finds the memos by looking.
"""

from __future__ import annotations

_PACKAGE = __name__.rpartition(".")[0]


def clear_caches() -> None:
    """Forget what earlier compiles in this process memoised (reshard plans, einsum parses, halo
    windows, ...), as jax.clear_caches() does for jax: the next compile pays what it pays in a
    fresh process, less the one-time setup that any process pays once (lark's parse tables, the
    helper sources every emitted module copies), whose caches say so with `keep_on_clear`.
    A memo is found wherever it lives in the package: any module-level or class-level function
    with `cache_clear` (functools.lru_cache / cache) is cleared."""
    import sys

    for name, module in list(sys.modules.items()):
        if module is None or not (name == _PACKAGE or name.startswith(_PACKAGE + ".")):
            continue
        for obj in list(vars(module).values()):
            owners = [obj]
            if isinstance(obj, type) and obj.__module__ == name:
                owners += [getattr(obj, attr, None) for attr in vars(obj)]
            for f in owners:
                if callable(getattr(f, "cache_clear", None)) and not getattr(f, "keep_on_clear", False):
                    f.cache_clear()
