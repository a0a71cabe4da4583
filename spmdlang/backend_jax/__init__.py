"""jax backends: our shard_map module and the XLA-GSPMD baseline (emit), and running them (runner)."""

from __future__ import annotations

# The oldest jax the emitted modules run on (measured: see pyproject.toml's bound and docs/performance.md).
MIN_JAX = (0, 6, 1)


def _version_tuple(text: str) -> tuple[int, ...]:
    import re

    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g or 0) for g in m.groups()) if m else (0,)


def require_jax():
    """jax, imported, or a clear SpmdError when it is missing or older than MIN_JAX."""
    from ..errors import SpmdError

    want = ".".join(map(str, MIN_JAX))
    try:
        import jax
    except ImportError as e:
        raise SpmdError(f"the jax backends need jax >= {want}, which is not installed ({e}); "
                        f"pip install 'jax>={want}'") from None
    if _version_tuple(jax.__version__) < MIN_JAX:
        raise SpmdError(f"the jax backends need jax >= {want}, but jax {jax.__version__} is installed; "
                        f"pip install -U 'jax>={want}'")
    return jax
