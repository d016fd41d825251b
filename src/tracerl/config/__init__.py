"""Configuration. Owns the pydantic models for every component, TOML loading and dotted overrides.

Must not import torch: the CLI parses and validates configuration before any heavy
import, so a typo fails in well under a second.
"""

from tracerl.config.base import (
    Config,
    ConfigError,
    field_help,
    load_config,
    parse_overrides,
    save_resolved_config,
)
from tracerl.config.control import ConcurrencyConfig, OrchestratorConfig
from tracerl.config.engine import (
    EngineCommandConfig,
    EngineConfig,
    ServerConfig,
    SimEngineConfig,
    SimFaults,
)
from tracerl.config.gateway import GatewayCommandConfig, GatewayConfig, ServeConfig
from tracerl.config.pool import PoolConfig
from tracerl.config.run import LoggingConfig, LoopConfig, TrainCommandConfig
from tracerl.config.sft import SftCommandConfig
from tracerl.config.telemetry import TelemetryConfig
from tracerl.config.train import TrainerConfig
from tracerl.config.view import ViewConfig

__all__ = [
    "ConcurrencyConfig",
    "Config",
    "ConfigError",
    "EngineCommandConfig",
    "EngineConfig",
    "GatewayCommandConfig",
    "GatewayConfig",
    "LoggingConfig",
    "LoopConfig",
    "OrchestratorConfig",
    "PoolConfig",
    "ServeConfig",
    "ServerConfig",
    "SftCommandConfig",
    "SimEngineConfig",
    "SimFaults",
    "TelemetryConfig",
    "TrainCommandConfig",
    "TrainerConfig",
    "ViewConfig",
    "field_help",
    "load_config",
    "parse_overrides",
    "save_resolved_config",
]
