"""What every console page is handed (``Console``): the gateway that serves it (its store, its
keys' verdicts, settings, routing table and metrics) and the control plane, reached through the
seam the wiring gives (console/plane.py), each a typed field; nothing is hung on the gateway."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from console.plane import ControlPlane
from gateway.app import Gateway
from gateway.config import GatewaySettings
from scheduler.errors import InvalidInput


@dataclass
class Console:
    gw: Gateway
    plane: ControlPlane | None = None  # None: started without Temporal, so the store's view only
    namespace: str = "default"  # the Temporal namespace, for links to the Temporal UI
    # serving_stats.py: (gateway, model) -> (when, its request count) at the last read: a rate between two reads
    serving_prev: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    @property
    def engine(self) -> Engine:
        return self.gw.engine

    @property
    def settings(self) -> GatewaySettings:
        return self.gw.settings

    def control(self) -> ControlPlane:
        """The control plane; InvalidInput (shown on the page) when this console has none."""
        if self.plane is None:
            raise InvalidInput("this gateway was started without Temporal settings (--address): the console can show "
                               "the store's view but cannot act or ask the control plane")
        return self.plane
