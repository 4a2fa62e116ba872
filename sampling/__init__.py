"""Client selection and heterogeneity samplers (``fedjax_het.sampling``)."""

from fedjax_het.sampling.dpcsm import StateSample, dpcsm, ready_fraction_score
from fedjax_het.sampling.dpgmm import DeviceSample, dpgmm
from fedjax_het.sampling.freezefl_selection import freezefl_selection
from fedjax_het.sampling.hdfl import hdfl, ls_fl
from fedjax_het.sampling.oort import oort
from fedjax_het.sampling.power_of_choice import power_of_choice
from fedjax_het.sampling.presets import (
    DEVICE_CASES,
    DEVICE_PRESETS,
    STATE_CASES,
    STATE_PRESETS,
    DevicePreset,
    InterplayGrid,
    StatePreset,
    interplay_grid,
    sample_devices,
    sample_states,
)
from fedjax_het.sampling.rbcs_f import rbcs_f
from fedjax_het.sampling.uniform import uniform

__all__ = [
    "DEVICE_CASES",
    "DEVICE_PRESETS",
    "STATE_CASES",
    "STATE_PRESETS",
    "DevicePreset",
    "DeviceSample",
    "InterplayGrid",
    "StatePreset",
    "StateSample",
    "dpcsm",
    "dpgmm",
    "freezefl_selection",
    "hdfl",
    "interplay_grid",
    "ls_fl",
    "oort",
    "power_of_choice",
    "rbcs_f",
    "ready_fraction_score",
    "sample_devices",
    "sample_states",
    "uniform",
]
