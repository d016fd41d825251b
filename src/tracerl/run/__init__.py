"""The RL loop (`tracerl train`): dataset -> dispatcher -> environments through the gateway ->
traces -> rewards -> trainer -> weight sync, with checkpoints, eval and metrics. No algorithm
math here: that is `tracerl.algo` and `tracerl.train`."""
