"""Mesh and Sharding live in spmdlang.ir.mesh (the IR owns them); re-exported for old imports."""

from ..ir.mesh import Mesh, Sharding

__all__ = ["Mesh", "Sharding"]
