"""Concurrency-control protocols, one module each, behind ``dgcc.api.Protocol``.

``PROTOCOLS`` maps each protocol's name (the same string as its module, CLI value and plot
label) to its class; ``get_protocol`` names the valid choices when given a wrong one.
"""

from __future__ import annotations

from dgcc.api import Protocol
from dgcc.errors import ConfigError
from dgcc.protocols.calvin import CalvinProtocol
from dgcc.protocols.dgcc import DgccProtocol
from dgcc.protocols.no_wait import NoWaitProtocol
from dgcc.protocols.occ import OccProtocol
from dgcc.protocols.serial import SerialProtocol
from dgcc.protocols.wait_die import WaitDieProtocol

PROTOCOLS: dict[str, type[Protocol]] = {
    SerialProtocol.name: SerialProtocol,
    DgccProtocol.name: DgccProtocol,
    NoWaitProtocol.name: NoWaitProtocol,
    WaitDieProtocol.name: WaitDieProtocol,
    OccProtocol.name: OccProtocol,
    CalvinProtocol.name: CalvinProtocol,
}


def get_protocol(name: str) -> type[Protocol]:
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ConfigError(
            f"unknown protocol {name!r}; choose one of: {', '.join(sorted(PROTOCOLS))}"
        ) from None


__all__ = ["PROTOCOLS", "get_protocol"]
