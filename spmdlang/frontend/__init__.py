"""Frontend: source text -> AST (parse) -> global IR (lower)."""
