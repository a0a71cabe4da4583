"""api.clear_caches: the next compile pays what a fresh process pays (the benchmarks time it)."""

import spmdlang
from spmdlang.frontend.parse import _parser
from spmdlang.memo import clear_caches
from spmdlang.partition import reshard

PROGRAM = """
mesh [x=2, y=2]
func main(a: f32[6, 10] {x, y}) -> f32[6, 10] {y, x} {
  return a * 2.0
}
"""


def test_clear_caches_forgets_plans_and_keeps_setup():
    c = spmdlang.compile(PROGRAM)
    first = c.jax_source
    assert reshard._plan_reshard.cache_info().currsize > 0
    clear_caches()
    assert reshard._plan_reshard.cache_info().currsize == 0
    assert _parser.cache_info().currsize == 1  # lark's tables are setup, not a memo of a compile
    assert c.recompiled().jax_source == first  # a cold compile emits the same module
