"""`tracerl` command dispatch: parse arguments, validate config, then lazily import the work."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from tracerl.bench import BENCHMARKS
from tracerl.config import (
    ConfigError,
    EngineCommandConfig,
    GatewayCommandConfig,
    ServeConfig,
    SftCommandConfig,
    TrainCommandConfig,
    ViewConfig,
    field_help,
    load_config,
    save_resolved_config,
)
from tracerl.config.base import InputError


def _config_epilog(cls: Any) -> str:
    rows = field_help(cls)
    width = max(len(path) for path, *_ in rows)
    lines = ["configuration (set in the TOML file or as --KEY.PATH=VALUE):"]
    for path, type_name, default, doc in rows:
        default_text = f" [default: {default}]" if default else ""
        lines.append(f"  {path:<{width}}  {type_name}{default_text}")
        if doc:
            lines.append(f"  {'':<{width}}    {' '.join(doc.split())}")
    return "\n".join(lines)


def _split_overrides(parser: argparse.ArgumentParser, extra: list[str]) -> list[str]:
    """Accept `--a.b=v` and `--a.b v`; anything else is an unknown argument."""
    overrides, i = [], 0
    while i < len(extra):
        arg = extra[i]
        if arg.startswith("--") and "." in arg.split("=", 1)[0]:
            if "=" not in arg:
                if i + 1 >= len(extra):
                    parser.error(f"override {arg} needs a value")
                arg, i = f"{arg}={extra[i + 1]}", i + 1
            overrides.append(arg[2:])
        else:
            parser.error(f"unrecognized argument: {arg}")
        i += 1
    return overrides


def _finish_config(config: Any, args: argparse.Namespace) -> Any:
    if args.run_dir is not None:
        print(f"resolved config: {save_resolved_config(config, args.run_dir)}", flush=True)
    return config


def _cmd_engine(args: argparse.Namespace, overrides: list[str]) -> int:
    base: dict[str, Any] = {"engine": {}, "server": {}}
    _set(base["engine"], "model", args.model)
    _set(base["server"], "host", args.host)
    _set(base["server"], "port", args.port)
    config = _finish_config(load_config(EngineCommandConfig, args.config, overrides, base), args)
    if config.engine.backend != "local" or config.engine.urls:
        raise ConfigError(
            "engine.backend: `tracerl engine` serves the embedded engine (or --sim); the "
            "backend and urls settings are for train, serve and gateway"
        )
    from tracerl.cli.engine import run_engine

    return run_engine(config, sim=args.sim)


def _gateway_base(args: argparse.Namespace) -> dict[str, Any]:
    base: dict[str, Any] = {}
    _set(base, "host", args.host)
    _set(base, "port", args.port)
    _set(base, "store", args.store)
    _set(base, "admin_key", args.admin_key)
    if args.quiet:
        base["access_log"] = False
    return base


def _cmd_gateway(args: argparse.Namespace, overrides: list[str]) -> int:
    base = _gateway_base(args)
    _set(base, "model", args.model)
    _set(base, "engine_urls", args.engine_url)
    config = load_config(GatewayCommandConfig, args.config, overrides, {"gateway": base})
    from tracerl.cli.gateway import run_gateway

    return run_gateway(_finish_config(config, args))


def _cmd_serve(args: argparse.Namespace, overrides: list[str]) -> int:
    engine: dict[str, Any] = {}
    _set(engine, "model", args.model)
    base = {"engine": engine, "gateway": _gateway_base(args)}
    config = load_config(ServeConfig, args.config, overrides, base)
    from tracerl.cli.gateway import run_serve

    return run_serve(_finish_config(config, args), demo=args.demo, prompt=args.prompt)


def _set(target: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        target[key] = value


def _cmd_train(args: argparse.Namespace, overrides: list[str]) -> int:
    from tracerl.cli.train import prepare_run_dir, run_train
    from tracerl.run.preflight import check_model

    config = load_config(TrainCommandConfig, args.config, overrides)
    check_model(config)  # before the run directory: a bad model leaves nothing behind
    run_dir = prepare_run_dir(args.config, args.run_dir, args.resume)
    save_resolved_config(config, str(run_dir))
    return run_train(config, run_dir, resume=args.resume)


def _cmd_sft(args: argparse.Namespace, overrides: list[str]) -> int:
    from tracerl.cli.train import prepare_run_dir
    from tracerl.sft.run import run_sft

    config = load_config(SftCommandConfig, args.config, overrides)
    run_dir = prepare_run_dir(args.config, args.run_dir, args.resume)
    save_resolved_config(config, str(run_dir))
    return run_sft(config, run_dir, resume=args.resume)


def _cmd_plot(args: argparse.Namespace, overrides: list[str]) -> int:
    if overrides:
        raise ConfigError(f"plot takes no overrides, got {overrides}")
    from tracerl.run.plot import plot_run

    for path in plot_run(args.run_dir):
        print(path)
    return 0


def _cmd_view(args: argparse.Namespace, overrides: list[str]) -> int:
    base: dict[str, object] = {"run_dir": args.run_dir}
    _set(base, "host", args.host)
    _set(base, "port", args.port)
    _set(base, "admin_key", args.admin_key)
    _set(base, "refresh_s", args.refresh_s)
    config = load_config(ViewConfig, args.config, overrides, base)
    from tracerl.cli.view import run_view

    return run_view(config)


def _cmd_export(args: argparse.Namespace, overrides: list[str]) -> int:
    if overrides:
        raise ConfigError(f"export takes no overrides, got {overrides}")
    from pathlib import Path

    from tracerl.train.export import export_checkpoint

    print(export_checkpoint(Path(args.run_dir), Path(args.out), args.step, args.adapter))
    return 0


def _cmd_cluster(args: argparse.Namespace, overrides: list[str]) -> int:
    if overrides:
        raise ConfigError(f"cluster status takes no overrides, got {overrides}")
    from pathlib import Path

    from tracerl.cluster import status

    try:
        print(status.render(status.read(Path(args.run_dir))))
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    return 0


def _cmd_bench(args: argparse.Namespace, overrides: list[str]) -> int:
    if overrides and args.name != "learn":
        raise ConfigError(
            f"bench {args.name} takes no overrides, got {overrides} (only bench learn does: "
            "they apply to its tracerl runs)"
        )
    args.overrides = overrides
    from tracerl.bench import run_benchmark

    return run_benchmark(args.name, args)


def _run_command(
    sub: Any,
    name: str,
    func: Callable[[argparse.Namespace, list[str]], int],
    config: Any,
    examples: str,
    **text: str,
) -> None:
    """A command that runs in a run directory from a TOML config (`train`, `sft`)."""
    parser = sub.add_parser(
        name, epilog=_config_epilog(config), formatter_class=argparse.RawDescriptionHelpFormatter,
        **text,
    )  # fmt: skip
    parser.add_argument("config", help=f"TOML config file (see {examples})")
    parser.add_argument(
        "--run-dir", help="run directory (default: runs/<config name>); must be new or --resume"
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue the run directory's last checkpoint"
    )
    parser.set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracerl", description="Reinforcement learning for LLM agents from recorded traces."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter

    engine = sub.add_parser(
        "engine",
        help="serve one inference engine (engine wire protocol)",
        epilog=_config_epilog(EngineCommandConfig),
        formatter_class=fmt,
    )
    gateway = sub.add_parser(
        "gateway",
        help="the trace-recording OpenAI/Anthropic gateway in front of engines",
        epilog=_config_epilog(GatewayCommandConfig),
        formatter_class=fmt,
    )
    serve = sub.add_parser(
        "serve",
        help="embedded engine + gateway in one command, for capturing traces by hand",
        description="Start the embedded engine and the gateway; --demo sends one chat request "
        "through the openai SDK, prints it, the answer and what was recorded, and exits.",
        epilog=_config_epilog(ServeConfig),
        formatter_class=fmt,
    )
    for p in (engine, gateway, serve):
        p.add_argument("config", nargs="?", help="TOML config file")
        p.add_argument("--model", help="local HF directory or built-in name (smollm2-135m, tiny)")
        p.add_argument("--host", help="interface to bind (default 127.0.0.1)")
        p.add_argument("--port", type=int, help="TCP port (0 picks a free one)")
        p.add_argument("--run-dir", help="write the resolved config.json here")
    for p in (gateway, serve):
        p.add_argument("--store", help="SQLite trace store file")
        p.add_argument("--admin-key", help="admin key (generated and printed when unset)")
        p.add_argument("--quiet", action="store_true", help="no access log line per request")
    gateway.add_argument("--engine-url", action="append", help="an engine (repeatable)")
    engine.add_argument(
        "--sim", action="store_true", help="the simulated engine (no model; see the sim.* settings)"
    )
    engine.set_defaults(func=_cmd_engine)
    gateway.set_defaults(func=_cmd_gateway)
    serve.add_argument(
        "--demo", action="store_true", help="answer one chat request, print it, and exit"
    )
    serve.add_argument(
        "--prompt",
        default="What is the capital of France? Answer in one sentence.",
        help="the chat message of the demo request",
    )
    serve.set_defaults(func=_cmd_serve)

    _run_command(
        sub, "train", _cmd_train, TrainCommandConfig, "examples/",
        help="the RL loop: rollouts through the gateway, trainer, weight sync",
        description="Train a policy with RL: tasks from the dataset are played by the "
        "environment through the trace-recording gateway, rewarded, and trained on; new "
        "weights go to the engine after every step. Ctrl-C checkpoints and stops cleanly.",
    )  # fmt: skip

    _run_command(
        sub, "sft", _cmd_sft, SftCommandConfig, "examples/sft/",
        help="supervised fine-tuning on conversations or on a run's recorded traces",
        description="Fine-tune the model on OpenAI-format conversations (loss on assistant "
        "tokens only) or on the recorded episodes of runs filtered by reward (rejection "
        "sampling), with the trainer's batching, checkpoints (--resume) and export.",
    )  # fmt: skip

    plot = sub.add_parser("plot", help="PNG charts of a run (reward, losses, KL, throughput)")
    plot.add_argument("run_dir", help="a run directory with metrics.jsonl")
    plot.set_defaults(func=_cmd_plot)

    view = sub.add_parser(
        "view",
        help="the trace viewer: a read-only web page over a run directory",
        description="Serve a web page over RUN_DIR, read while a run writes it: the metric "
        "charts, the episodes (filter by step, weight version, env, group, reward, failure), "
        "a group's samples side by side, and each session's turns and tokens (sampled or "
        "context, log-prob as colour). Binds 127.0.0.1; another interface needs --admin-key.",
        epilog=_config_epilog(ViewConfig),
        formatter_class=fmt,
    )
    view.add_argument("run_dir", help="a run directory (traces.sqlite, metrics.jsonl, ...)")
    view.add_argument("--config", help="TOML file with view settings")
    view.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    view.add_argument("--port", type=int, help="TCP port (default 8300; 0 picks a free one)")
    view.add_argument("--admin-key", help="key every request must carry (needed off loopback)")
    view.add_argument(
        "--refresh-s", type=float, help="seconds between the open page's checks (default 2)"
    )
    view.set_defaults(func=_cmd_view)

    export = sub.add_parser(
        "export",
        help="a run's trained model as a Hugging Face directory (transformers, vLLM)",
        description="Write the actor of RUN_DIR's checkpoint (the newest, or --step N) to OUT: "
        "safetensors, config, tokenizer and chat template; no optimizer state.",
    )
    export.add_argument("run_dir", help="a run directory with checkpoints/")
    export.add_argument("out", help="a new (or empty) directory to write")
    export.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    export.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA run: write the adapter alone (peft's layout), not the merged model",
    )
    export.set_defaults(func=_cmd_export)

    cluster = sub.add_parser("cluster", help="what a run's trainer ranks and engines run on")
    cluster_sub = cluster.add_subparsers(dest="cluster_command", required=True)
    cluster_status = cluster_sub.add_parser(
        "status", help="a run's trainer ranks and engines: where, alive, weight version"
    )
    cluster_status.add_argument("run_dir", help="a run directory (written while the run goes)")
    cluster_status.set_defaults(func=_cmd_cluster)

    bench = sub.add_parser(
        "bench", help="run a benchmark; the last line is one JSON object",
        epilog="bench learn also takes `tracerl train` overrides (--trainer.autocast=bfloat16): "
        "they apply to its tracerl runs, not to the start checkpoint or the judge",
    )  # fmt: skip
    bench.add_argument("name", choices=list(BENCHMARKS))
    bench.add_argument("--model", default="smollm2-135m", help="model to benchmark")
    bench.add_argument(
        "--backend",
        choices=("local", "vllm"),
        default="local",
        help="engine, gateway: vllm measures a vLLM server (the pool launches it) side by side",
    )
    bench.add_argument(
        "--engine-python", help="--backend vllm: the Python with vLLM (default .venv-vllm)"
    )
    bench.add_argument(
        "--requests", type=int, default=48, help="requests per round in the 16-concurrent run"
    )
    bench.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="timed rounds of each side (engine: 2 alternating engine/generate rounds; "
        "train, step: 3 steps each)",
    )
    bench.add_argument(
        "--forward",
        choices=("auto", "slots", "generic", "both"),
        default="auto",
        help="engine: the embedded engine's forward (engine.forward); both: the generic path "
        "measured beside the slot cache, in the same rounds",
    )
    bench.add_argument(
        "--autocast",
        action="store_true",
        help="step: also time the trainer with trainer.autocast = bfloat16, in the same rounds",
    )
    bench.add_argument("--sessions", type=int, default=500, help="faults: soak sessions")
    bench.add_argument("--quick", action="store_true", help="a small, fast configuration")
    bench.add_argument(
        "--sessions-1", type=int, default=20, help="gateway: 10-turn sessions run one at a time"
    )
    bench.add_argument(
        "--sessions-64", type=int, default=128, help="gateway: 10-turn sessions run 64 at a time"
    )
    bench.add_argument(
        "--workload",
        help="concurrency: a JSON file with one workload object or a list (default: built-ins)",
    )
    bench.add_argument(
        "--engine",
        choices=("sim", "embedded", "both"),
        default="both",
        help="loop: simulated engines (tiny trainer), the real model's embedded engine, or both",
    )
    bench.add_argument("--minutes", type=float, default=15.0, help="learn: budget per run")
    bench.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="learn: seeds per system and task (0: run none, summarise the --include runs)",
    )
    bench.add_argument(
        "--first-seed", type=int, default=0, help="learn: run seeds FIRST..FIRST+SEEDS-1"
    )
    bench.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="WORK_DIR",
        help="learn: fold an earlier run's WORK_DIR/runs.jsonl into the summary (repeatable); "
        "WORK_DIR:SYSTEM[,SYSTEM...] folds those systems' runs only",
    )
    bench.add_argument(
        "--start-from",
        metavar="WORK_DIR",
        help="learn: the agentic tasks start from an earlier run's start checkpoint and task files",
    )
    bench.add_argument("--tasks", default="hard,medium", help="learn: tasks (comma-separated)")
    bench.add_argument(
        "--systems", default="tracerl-grpo,tracerl-ppo,trl", help="learn: systems to run"
    )
    bench.add_argument(
        "--eval-every", type=int, default=20,
        help="learn: steps between the snapshots of tracerl's weights judged on hard and "
        "medium (judged after the run; the writes are charged)",
    )  # fmt: skip
    bench.add_argument(
        "--agent-checkpoint-every", type=int, default=3,
        help="learn: tracerl snapshot interval (steps) on the agentic tasks (judged after)",
    )  # fmt: skip
    bench.add_argument(
        "--temperature", type=float, default=1.0,
        help="learn: every system's rollout sampling temperature (tracerl's trainer.temperature "
        "and env.sampling.temperature, TRL's GRPOConfig.temperature); the judge stays greedy",
    )  # fmt: skip
    bench.add_argument("--work-dir", help="learn: where runs go (default runs/bench-learn-TIME)")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "httpcore"):  # SDK clients log every request at INFO
        logging.getLogger(noisy).setLevel(logging.WARNING)
    func: Callable[[argparse.Namespace, list[str]], int] = args.func
    try:
        return func(args, _split_overrides(parser, extra))
    except InputError as e:  # a config or dataset the user gave, named: no traceback
        print(f"tracerl: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
