"""System heterogeneity: device and state profiles, availability, the round schedule (docs/design.md §5)."""

from fedjax_het.system import availability, profiles, sources, sources_csv, sources_synthetic
from fedjax_het.system.availability import Availability
from fedjax_het.system.profiles import ClientProfiles

__all__ = [
    "Availability",
    "ClientProfiles",
    "availability",
    "profiles",
    "sources",
    "sources_csv",
    "sources_synthetic",
]
