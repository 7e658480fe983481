"""The kernel every stage shares: errors, the registry type, config type checks, ids, time, SQL text helpers,
terminal display and the package's paths. Nothing here imports a stage."""
