"""Long-tail operators, one module per domain group; each registers with tailjit.bench.registry.operator."""
