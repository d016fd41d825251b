"""The engine pool: the layer between the gateway and the engines (routing with session affinity;
health checks, retries, abort/resume and weight sync grow here)."""
