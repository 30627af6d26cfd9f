"""What a step costs on this machine: the curve the budget prices steps by (curve), how it is measured
(measure) and where it is kept between runs (store)."""

from .model import CostModel, flat_curve, load_cost_model, row_grid

__all__ = ["CostModel", "flat_curve", "load_cost_model", "row_grid"]
