"""The engine pool: the layer between the gateway and the engines. Owns routing with session
affinity, health checks, retries, abort and partial-rollout resume, engine restarts and the
weight-sync fan-out. Must not know about rewards (or anything else of RL but weight versions)."""
