"""Configuration of `tracerl view` (the trace viewer, `tracerl.view`)."""

from __future__ import annotations

import ipaddress

from pydantic import Field, model_validator

from tracerl.config.base import Config


def is_loopback(host: str) -> bool:
    """`host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ViewConfig(Config):
    """`tracerl view RUN_DIR`: a read-only web page over a run directory."""

    run_dir: str
    """The run directory to show (`traces.sqlite`, `metrics.jsonl`, `config.json`,
    `episodes.jsonl`); it is only ever read, also while a run writes it."""

    host: str = "127.0.0.1"
    """Interface to bind; loopback by default. Any other needs `admin_key`."""

    port: int = Field(default=8300, ge=0, le=65535)
    """TCP port; 0 picks a free one (the URL is printed at start)."""

    admin_key: str | None = None
    """Key every request must carry (`Authorization: Bearer KEY`, `x-api-key: KEY`, or once as
    `?key=KEY` in the browser, which keeps it in a cookie); required when `host` is not
    loopback, optional on loopback."""

    refresh_s: float = Field(default=2.0, gt=0, le=3600)
    """Seconds between the open page's checks for new metrics, episodes and turns."""

    page_size: int = Field(default=50, ge=1, le=1000)
    """Episodes per page of the episode list."""

    @model_validator(mode="after")
    def _key_off_loopback(self) -> ViewConfig:
        if not is_loopback(self.host) and not self.admin_key:
            raise ValueError(
                f"admin_key: required when host is {self.host!r} (not loopback): the viewer "
                "shows every recorded prompt and reply"
            )
        return self
