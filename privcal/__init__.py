"""privcal — privacy-accountable conformal calibration.

The public API is re-exported here; see the README for a tour.
"""

__version__ = "0.1.0"
