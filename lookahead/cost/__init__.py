"""What a step costs on this machine: the curve the budget prices steps by (curve), how it is measured
(measure) and where it is kept between runs (store: ``load_cost_model`` reads it or measures it)."""

from .curve import CostModel, flat_curve, row_grid
from .measure import cpu_name, measure_forward_seconds
from .store import load_cost_model, model_fingerprint

__all__ = ["CostModel", "cpu_name", "flat_curve", "load_cost_model", "measure_forward_seconds", "model_fingerprint",
           "row_grid"]
