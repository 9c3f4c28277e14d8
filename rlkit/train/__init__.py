"""The supervised trainer (fit / evaluate / predict): not built yet."""
