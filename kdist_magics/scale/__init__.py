"""Will more devices help? ``%kdist scale`` probes a cell's training at N = 1, 2, ... ranks,
measures the link between the engines, and predicts larger N from a stated model.

:mod:`.probe` runs it, :mod:`.link` measures the link (a ring all-reduce between the engines),
:mod:`.model` holds the model, its assumptions and the advice drawn from figures, and
:mod:`.table` is what ``kdist_magics.last_scale()`` returns.
"""
