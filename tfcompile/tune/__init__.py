"""Kernel tuning: config spaces, hardware pruning, an analytic cost model, the tuning table."""
