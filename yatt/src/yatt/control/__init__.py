"""Distribution: worker groups (in-process or Ray), single and parallel controllers, placement,
runtime re-placement, timelines and a discrete-event simulator.

This is the only yatt package that imports Ray, and only inside the Ray backend's functions, so
`import yatt.control` works without Ray installed.
"""

from yatt.control.config import ControlConfig
from yatt.control.devices import Device, discover_devices
from yatt.control.placement import PLACEMENTS, Placement, candidate_placements, make_placement

__all__ = [
    "PLACEMENTS",
    "ControlConfig",
    "Device",
    "Placement",
    "candidate_placements",
    "discover_devices",
    "fit_distributed",
    "make_controller",
    "make_placement",
]


def make_controller(config, control: ControlConfig):
    """The controller `control` selects (adaptive when `replace_every` > 0), workers spawned."""
    if control.replace_every:
        from yatt.control.adaptive import AdaptiveController

        return AdaptiveController(config, control)  # it measures the decode floor itself
    if control.mode == "single":
        from yatt.control.single import SingleController

        return SingleController(config, control)
    from yatt.control.parallel import ParallelController

    return ParallelController(config, control)


def fit_distributed(config, control: ControlConfig, progress=None):
    """Train with the selected controller; see yatt.control.run.fit_distributed."""
    from yatt.control.run import fit_distributed as fit

    return fit(config, control, progress)
