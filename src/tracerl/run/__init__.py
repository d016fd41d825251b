"""The RL loop (`tracerl train`): dataset -> dispatcher -> environments through the gateway ->
traces -> rewards -> trainer -> weight sync, with checkpoints, eval and metrics. Owns the
wiring, the async off-policy bookkeeping and the run directory's logs. Must not contain
algorithm math: that is `tracerl.algo` and `tracerl.train`."""
