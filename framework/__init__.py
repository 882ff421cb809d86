"""The engine: Params, NestedMap, BaseLayer, recurrence, registry, loops."""
